"""Save at step k, load, continue: bit-identical to an uninterrupted run (through the file)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import random_frames

from pvm_dist import build_engine, load_spec
from pvm_dist.io import checkpoint


@pytest.mark.parametrize("n_seq,k", [(1, 7), (3, 25)])
def test_resume_is_bit_identical(tmp_path, n_seq, k):
    spec = load_spec("tiny")  # layers enable at 0/20/40; k = 25 resumes mid-schedule
    frames = random_frames(spec, 50, n_seq=n_seq)
    straight = build_engine(spec, n_seq=n_seq, seed=9)
    straight.run(50, iter(frames))

    first = build_engine(spec, n_seq=n_seq, seed=9)
    first.run(k, iter(frames[:k]))
    path = checkpoint.save(tmp_path / "ck.pvmckpt", first.state(), {"spec": spec.to_dict(), "seed": 9, "n_seq": n_seq})
    del first

    ck = checkpoint.load(path, expect_spec=spec.to_dict())
    assert ck.step == k and ck.seed == 9
    resumed = build_engine(spec, n_seq=n_seq, seed=0)  # the seed comes back from the state
    resumed.load_state(ck.state)
    resumed.run(50 - k, iter(frames[k:]))
    a, b = straight.state(), resumed.state()
    assert a.keys() == b.keys()
    for key in a:
        assert np.array_equal(a[key], b[key]), key


def test_load_refuses_other_spec_and_sizes(tmp_path):
    spec = load_spec("tiny")
    eng = build_engine(spec, n_seq=2)
    eng.run(3, iter(random_frames(spec, 3, n_seq=2)))
    path = checkpoint.save(tmp_path / "ck.pvmckpt", eng.state(), {"spec": spec.to_dict(), "seed": 0})
    other = spec.with_overrides({"hidden_block_size": 2})
    with pytest.raises(checkpoint.CheckpointError, match="hidden_block_size"):
        checkpoint.load(path, expect_spec=other.to_dict())
    with pytest.raises(ValueError, match="x_ring"):
        build_engine(spec, n_seq=1).load_state(checkpoint.load(path).state)
