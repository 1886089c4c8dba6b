"""`disttrain render` prints a manifest a person would write: multi-line values as literal blocks."""

from __future__ import annotations

import yaml

from disttrain.builders.render import render, render_objects
from manifests import mpi_job, mwms_job


def test_multi_line_values_are_literal_blocks() -> None:
    out = render(yaml.safe_dump(mpi_job("hvd", workers=2, gpus=1)))
    assert "  hostfile: |\n    hvd-worker-0.hvd.default.svc slots=1\n    hvd-worker-1.hvd.default.svc slots=1\n" in out
    assert "  discover_hosts.sh: |\n    #!/bin/sh\n" in out
    assert "  config: |\n    Host *\n" in out
    assert "\n\n" not in out  # no quoted string with a blank line per line break


def test_output_loads_back_to_the_same_objects() -> None:
    for job in (mpi_job("hvd", workers=3, gpus=2), mwms_job("mw", workers=2)):
        assert list(yaml.safe_load_all(render(yaml.safe_dump(job)))) == render_objects(job)


def test_values_a_block_cant_hold_still_load_back() -> None:
    job = mwms_job("mw", workers=1)
    job["spec"]["tensorflow"]["worker"]["template"]["spec"]["containers"][0]["args"] = ["line \nnext\t\n", "x\n"]
    assert list(yaml.safe_load_all(render(yaml.safe_dump(job)))) == render_objects(job)
