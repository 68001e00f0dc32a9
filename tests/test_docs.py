"""The README is a short front door to the docs site, and the site stays complete.

Fast (no processes): README.md's size, its links to every page of docs/, the test
command CI runs, and the configuration page naming every environment variable the
package reads. The site itself is built by .ci/run's docs step (sphinx-build -W).
"""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
README_MAX_BYTES = 10 * 1024
TEST_COMMAND = ("python3 -m venv .venv && .venv/bin/pip install -q -e '.[notebook,torch,test]' "
                "&& .venv/bin/python -m pytest -q")


def readme_links() -> set[str]:
    """The docs/ files README.md links to, as paths relative to the repository root."""
    return {target for target in re.findall(r"\]\((docs/[^)#\s]+)", README.read_text())}


def test_readme_is_at_most_10_kib():
    size = len(README.read_bytes())
    assert size <= README_MAX_BYTES, (
        f"README.md is {size:,} bytes, over {README_MAX_BYTES:,}: move the detail into a page of docs/ "
        "and link it")


def test_readme_links_every_docs_page():
    pages = {f"docs/{p.name}" for p in DOCS.glob("*.md")}
    assert pages, "docs/ has no pages"
    missing = sorted(pages - readme_links())
    assert not missing, f"README.md links no page {missing}: add a link to each (every page one click away)"


def test_readme_links_only_pages_that_exist():
    broken = sorted(link for link in readme_links() if not (ROOT / link).exists())
    assert not broken, f"README.md links {broken}, which do not exist"


def test_readme_test_command_is_what_ci_runs():
    assert TEST_COMMAND in README.read_text(), "README.md lost the test command line"
    assert TEST_COMMAND in (ROOT / ".ci" / "run").read_text(), ".ci/run no longer runs README.md's test command"


def package_variables() -> set[str]:
    """Every MONARCH_NB_* name in the package's source."""
    found: set[str] = set()
    for source in (ROOT / "monarch_nb").rglob("*.py"):
        found.update(re.findall(r"\bMONARCH_NB_[A-Z0-9_]*[A-Z0-9]\b", source.read_text()))
    return found


def test_configuration_page_names_every_environment_variable():
    variables = package_variables()
    assert "MONARCH_NB_HOME" in variables  # the scan finds what it is meant to
    page = (DOCS / "configuration.md").read_text()
    missing = sorted(v for v in variables if f"`{v}`" not in page)
    assert not missing, f"docs/configuration.md does not describe {missing}: add a row for each"
