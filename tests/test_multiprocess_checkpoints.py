"""Checkpoint x checkpoint matrices on 2 real processes, or 3 devices of one, equal one device.

With several JAX processes, ``similarity.checkpoints`` shards the upper-triangle
pair list of its tensor matrices over the global mesh (every device of every
process: ``similarity.compare_grid``'s device plan) and every process gets the
whole matrix. The reference is the same worker in the test's own process, which takes the one-process path
(``similarity.similarity_matrix`` / ``attention_similarity_matrix``): two code
paths, compared element-wise in float64 at 1e-10. Slow (real processes).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests._multiprocess import run_in_processes

N_CHECKPOINTS = 5  # 15 pairs i <= j: not a multiple of the 2 devices (padding is exercised)


def matrices_worker(seed: int) -> dict:
    import jax

    from funsim.similarity import BilinearLayer
    from funsim.similarity import checkpoints as cs
    from tests.test_checkpoint_similarity import _attention_checkpoints, _checkpoints

    rng = np.random.default_rng(seed)
    nets = _checkpoints(rng, N_CHECKPOINTS)
    out = cs.checkpoint_matrices(nets, data={"x": rng.normal(size=(16, 5))}, metrics=("symmetric", "gaussian"))

    def res(s):  # a residual last layer: no output slicing, one inner product per output
        return (BilinearLayer(rng.normal(size=(4, 3)), rng.normal(size=(4, 3)), s * rng.normal(size=(3, 4)),
                              residual=True),)

    out.update({f"residual/{k}": v for k, v in
                cs.tensor_matrices([res(s) for s in (0.5, 1.0, 1.5)], metrics=("gaussian",)).items()})
    att = _attention_checkpoints(rng, 4)
    out.update({f"attention/{k}": v for k, v in
                cs.tensor_matrices(att, metrics=("gaussian",), per_output=False, context=2).items()})
    result = {k.replace("/", "~"): np.asarray(v) for k, v in out.items()}
    result["sharded"] = np.array(jax.device_count() > 1)  # the device plan has a mesh
    return result


def _check_equal_to_one_device(tmp_path, processes: int, devices: int) -> None:
    ref = matrices_worker(0)
    assert not bool(ref.pop("sharded"))
    assert {"tensor~symmetric", "tensor~gaussian~outputs", "residual~tensor~gaussian~outputs",
            "attention~tensor~gaussian", "behavioral~x", "cka~x"} <= set(ref)
    results = run_in_processes(matrices_worker, processes, 0, workdir=tmp_path, timeout_s=600, cpu_devices=devices)
    for p, r in enumerate(results):
        assert bool(r.pop("sharded")), f"process {p} did not shard the pair list"
        assert sorted(r) == sorted(ref)
        for k, v in ref.items():
            assert r[k].shape == v.shape, k
            np.testing.assert_allclose(r[k], v, rtol=0, atol=1e-10, err_msg=f"process {p}: {k}")
        assert np.abs(r["tensor~gaussian"] - 1).max() > 1e-3  # the checkpoints differ


@pytest.mark.slow
def test_checkpoint_matrices_on_two_processes_equal_one(tmp_path):
    _check_equal_to_one_device(tmp_path, 2, 1)


@pytest.mark.slow
def test_checkpoint_matrices_on_three_devices_of_one_process_equal_one_device(tmp_path):
    """The default devices=None of one process with several devices shards the pairs over them, as compare_grid."""
    _check_equal_to_one_device(tmp_path, 1, 3)
