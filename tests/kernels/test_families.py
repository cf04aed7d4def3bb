"""Every family and every campaign, statically: what `tik-evo check` verifies, for all of them."""

from pathlib import Path

import pytest

from tik_evo.cli import check_family, main
from tik_evo.families import available, load_family
from tik_evo.knobs import read_knobs

ROOT = Path(__file__).resolve().parents[2]
CAMPAIGNS = sorted((ROOT / "campaigns").glob("*.yaml"))


@pytest.mark.parametrize("name", available())
def test_family_root_and_knob_space(name):
    family = load_family(name)
    assert check_family(family) == []
    knobs = read_knobs(family.root_source())
    assert set(knobs) == {k.name for k in family.knobs}
    assert all(k.role in ("contract", "full", "decode") for k in family.knobs)
    assert family.requirements().strip(), "numerical requirements in words are missing"
    assert family.opportunities(), "no initial opportunities"


@pytest.mark.parametrize("campaign", CAMPAIGNS, ids=lambda p: p.stem)
def test_campaign_checks(campaign):
    assert main(["check", str(campaign)]) == 0


def test_every_family_has_a_campaign():
    kernels = {line.split(":", 1)[1].strip() for c in CAMPAIGNS for line in c.read_text().splitlines()
               if line.startswith("kernel:")}
    assert set(available()) <= kernels
