"""One version for the package, the chart and the operator image (hack/version.py), and a CHANGELOG
section for it: a release bumps disttrain.__version__ and these follow or fail here."""

from __future__ import annotations

import re

import yaml

import disttrain
from support import ROOT


def test_the_chart_is_versioned_with_the_package() -> None:
    chart = yaml.safe_load((ROOT / "charts" / "disttrain-operator" / "Chart.yaml").read_text())
    assert (chart["version"], chart["appVersion"]) == (disttrain.__version__, disttrain.__version__)


def test_the_operator_image_is_tagged_with_the_package_version() -> None:
    import images
    import registry
    from version import VERSION

    assert disttrain.__version__ == VERSION
    assert next(i.ref for i in images.IMAGES if i.name == "operator").endswith(f"/disttrain/operator:{VERSION}")
    assert f"disttrain/operator:{VERSION}" == registry.OPERATOR


def test_the_changelog_opens_with_this_version() -> None:
    headings = re.findall(r"^## (\S+)", (ROOT / "CHANGELOG.md").read_text(), re.MULTILINE)
    assert headings[0] == disttrain.__version__, headings[:2]
    assert len(headings) == len(set(headings)), f"a version twice: {headings}"
