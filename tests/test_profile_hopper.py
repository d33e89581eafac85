"""The on-chip profile reader of experiments/profile_hopper.py on a hand-made trace."""

import pytest

from experiments.profile_hopper import summarize


def _region(tid, name, begin, end):
  """A begin/end pair as Mosaic GPU's profiler writes it (ts: cycles / 1000)."""
  return [{"name": name, "ph": "B", "ts": begin / 1e3, "pid": 1, "tid": tid},
          {"name": name, "ph": "E", "ts": end / 1e3, "pid": 1, "tid": tid}]


def test_cycles_per_item_by_region_and_role():
  """Two CTAs of two warpgroups (tid = 1 + wg + 2 * cta): per role, the mean over CTAs of
  each top-level region's cycles per item (items counted by their epilogues), nested regions
  inside their parent, and the span's rest as "other"."""
  events = []
  for cta, scale in ((0, 1), (1, 3)):
    compute, stream = 1 + 2 * cta, 2 + 2 * cta
    for item in range(2):  # two items of 1000 cycles: softmax 400, epilogue 100
      t0 = item * 1000 * scale
      events += _region(compute, "softmax", t0, t0 + 400 * scale)
      events += _region(compute, "turn", t0 + 50 * scale, t0 + 100 * scale)  # nested
      events += _region(compute, "epilogue", t0 + 900 * scale, t0 + 1000 * scale)
    events += _region(stream, "gather", 0, 1500 * scale)
    events += _region(stream, "wait_rows_free", 1500 * scale, 2000 * scale)
  out = summarize({"traceEvents": events}, warpgroups=2)
  wg0, wg1 = out["wg0"], out["wg1"]
  assert wg0["traces"] == 2 and wg0["items"] == 2
  assert wg0["span"] == pytest.approx(2000)  # (1000 + 3000) / 2 cycles per item, mean of CTAs
  assert wg0["softmax"] == pytest.approx(800) and wg0["epilogue"] == pytest.approx(200)
  assert "turn" not in wg0
  assert wg0["other"] == pytest.approx(1000)
  # A role without epilogues: totals over the captured span (items 0, counted as one).
  assert wg1["items"] == 0 and wg1["gather"] == pytest.approx(3000)
  assert wg1["wait_rows_free"] == pytest.approx(1000) and wg1["other"] == pytest.approx(0)


def test_cta_with_more_items_weighs_more_and_a_region_of_one_cta_counts_in_the_mean():
  """One warpgroup role (the third of three: tid = 3 + 3 * cta) over two CTAs of 3000 cycles
  each: one item (softmax 2000, epilogue 500) and three (wait_kv 200, softmax 300, epilogue
  300 each). Per item means the role's cycles over its items, 6000 / 4, not the mean of each
  CTA's own per-item time; wait_kv, absent from the first CTA, counts 0 there."""
  events = _region(3, "softmax", 0, 2000) + _region(3, "epilogue", 2500, 3000)
  for item in range(3):
    t0 = item * 1000
    events += (_region(6, "wait_kv", t0, t0 + 200) + _region(6, "softmax", t0 + 300, t0 + 600)
               + _region(6, "epilogue", t0 + 700, t0 + 1000))
  (role,) = summarize({"traceEvents": events}, warpgroups=3).items()
  assert role[0] == "wg2"
  s = role[1]
  assert s["traces"] == 2 and s["items"] == 2
  assert s["span"] == pytest.approx(6000 / 4)
  assert s["softmax"] == pytest.approx((2000 + 900) / 4)
  assert s["epilogue"] == pytest.approx((500 + 900) / 4)
  assert s["wait_kv"] == pytest.approx(600 / 4)
  assert s["other"] == pytest.approx((6000 - 2900 - 1400 - 600) / 4)


def test_a_role_with_fewer_items_than_ctas_divides_by_its_items():
  """Two CTAs of one role (the only one: warpgroups=1), one with an item of 1000 cycles
  (softmax 600, epilogue 400), one that captured none (1000 cycles of softmax): 2000 cycles over
  one item, not the mean CTA's 1000."""
  events = (_region(1, "softmax", 0, 600) + _region(1, "epilogue", 600, 1000)
            + _region(2, "softmax", 0, 1000))
  ((_, s),) = summarize({"traceEvents": events}, warpgroups=1).items()
  assert s["items"] == 0.5
  assert s["span"] == pytest.approx(2000)
  assert s["softmax"] == pytest.approx(1600) and s["epilogue"] == pytest.approx(400)
