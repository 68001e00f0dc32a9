"""The hub: one daemon per cluster owning hosts, the mesh registry and control ops."""
