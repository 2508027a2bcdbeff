"""Two processes building an eager disk store over one spill path: one store.

The race of `tests/test_spill_race.py` (which says what it checks), with
stores built eagerly.
"""

from tests import test_spill_race


def test_one_of_two_racing_stores_is_built_every_time(tmp_path):
  test_spill_race.check_race("eager", str(tmp_path))
