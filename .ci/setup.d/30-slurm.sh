# A real Slurm for tests/test_slurm.py and bench/bench_slurm.py: Debian's slurmctld,
# slurmd and munge, configured for this one machine with two emulated nodes (n1, n2;
# one slurmd each, all at 127.0.0.1). Sourced by .ci/run (bash, set -euo pipefail);
# also runnable on its own (`bash .ci/setup.d/30-slurm.sh`), and idempotent: daemons
# already running are left alone. Daemons it starts are stopped at exit (ci_on_exit).
#
# No systemd here and the packages' scripts start nothing, so munged, slurmctld and
# the slurmds are started by hand, in the background.

if ! declare -F ci_on_exit >/dev/null; then ci_on_exit() { :; }; fi  # run on its own

slurm_nodes=(n1 n2)
slurm_run=/run/monarch-nb-slurm  # pid and log files of the daemons started here

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null \
        || ! command -v sbatch >/dev/null; then
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
            slurmctld slurmd slurm-client munge >/dev/null; then
        apt-get update -q >/dev/null  # a fresh machine may have no package lists yet
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
            slurmctld slurmd slurm-client munge >/dev/null
    fi
fi
mkdir -p "$slurm_run" /var/spool/slurmctld /var/spool/slurmd /var/log/slurm

# Config: written every time (cheap), so a change here reaches an already set up machine
# at its next daemon start.
slurm_conf_new=$(cat <<EOF
# Written by monarch_nb's .ci/setup.d/30-slurm.sh: one machine, emulated nodes.
ClusterName=monarchnb
SlurmctldHost=$(hostname)(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
SlurmdParameters=config_overrides
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd/%n
SlurmctldPidFile=$slurm_run/slurmctld.pid
SlurmdPidFile=$slurm_run/slurmd-%n.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd-%n.log
ReturnToService=2
KillWait=2
MinJobAge=600
InactiveLimit=0
MessageTimeout=10
EOF
)
slurm_port=17001
for n in "${slurm_nodes[@]}"; do
    slurm_conf_new+=$'\n'"NodeName=$n NodeAddr=127.0.0.1 NodeHostname=$(hostname) Port=$slurm_port CPUs=2 State=UNKNOWN"
    slurm_port=$((slurm_port + 1))
done
slurm_conf_new+=$'\n'"PartitionName=debug Nodes=$(IFS=,; echo "${slurm_nodes[*]}") Default=YES MaxTime=INFINITE State=UP"
if [ "$(cat /etc/slurm/slurm.conf 2>/dev/null)" != "$slurm_conf_new" ]; then
    printf '%s\n' "$slurm_conf_new" > /etc/slurm/slurm.conf
fi

slurm_alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

# munge: the package made the key; munged runs as user munge and needs /run/munge.
if ! slurm_alive /run/munge/munged.pid; then
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    chown munge:munge /run/munge /var/log/munge /var/lib/munge /etc/munge /etc/munge/munge.key
    chmod 0700 /etc/munge && chmod 0400 /etc/munge/munge.key && chmod 0755 /run/munge
    runuser -u munge -- /usr/sbin/munged --force
    ci_on_exit 'kill "$(cat /run/munge/munged.pid)"'
fi

if ! slurm_alive "$slurm_run/slurmctld.pid"; then
    # -c: forget jobs of an earlier run; -i: ignore state files that don't fit the config.
    /usr/sbin/slurmctld -c -i
    ci_on_exit "kill \"\$(cat $slurm_run/slurmctld.pid)\""
fi
for n in "${slurm_nodes[@]}"; do
    if ! slurm_alive "$slurm_run/slurmd-$n.pid"; then
        mkdir -p "/var/spool/slurmd/$n"
        /usr/sbin/slurmd -N "$n"
        ci_on_exit "kill \"\$(cat $slurm_run/slurmd-$n.pid)\""
    fi
done

# Ready when the controller answers and every node is idle (scontrol only runs once
# slurmctld's pid file exists: without a controller it would block for long).
slurm_ready=0
for _ in $(seq 1 100); do
    if slurm_alive "$slurm_run/slurmctld.pid" \
            && timeout 5 scontrol ping 2>/dev/null | grep -q UP \
            && [ "$(timeout 5 sinfo -h -p debug -t idle,mix,alloc -o %D 2>/dev/null)" = "${#slurm_nodes[@]}" ]; then
        slurm_ready=1
        break
    fi
    sleep 0.2
done
if [ "$slurm_ready" != 1 ]; then
    echo "30-slurm.sh: Slurm did not come up; see /var/log/slurm/" >&2
    tail -n 20 /var/log/slurm/slurmctld.log >&2 || true
    false
fi
