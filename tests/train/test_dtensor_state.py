"""DTensor's caches outlive a process group: a mesh hashes without its rank, so an op's cached output spec
carries the mesh (and coordinate) of whoever ran it first. Oracles: the coordinate the mesh of the running rank
gives, and torch.distributed.checkpoint's own plan validation across two forked gloo ranks."""

import pytest

torch = pytest.importorskip("torch")

from tests.train.runs import run  # noqa: E402
from tests.train.test_peft_train import ALL  # noqa: E402
from trainmath.runtime import dtensor_state  # noqa: E402


def _op_coordinate(rank: int, forget_before: bool) -> tuple:
    """The mesh coordinate of a DTensor op's output, run as ``rank`` of a fake world of 2."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if forget_before:
        dtensor_state.forget()
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=2)
    try:
        mesh = init_device_mesh("cpu", (2,))
        x = distribute_tensor(torch.ones(8, 4), mesh, [Shard(0)])
        return (x * 2).device_mesh.get_coordinate()
    finally:
        dist.destroy_process_group()


def test_a_cached_spec_names_the_rank_that_ran_first_until_forgotten():
    try:
        assert _op_coordinate(0, forget_before=True) == (0,)
        assert _op_coordinate(1, forget_before=False) == (0,)  # torch's cache: rank 1 is told it is rank 0
        assert _op_coordinate(1, forget_before=True) == (1,)
    finally:
        dtensor_state.forget()


def test_forked_ranks_checkpoint_after_a_fake_rank_0_ran_here(tmp_path, monkeypatch):
    """The launcher's workers forget what they inherited: FSDP2 ranks save a peft checkpoint DCP accepts after
    this process ran the peft FSDP2 simulation as rank 0 of 2 and kept its caches (its own forgetting is
    switched off here, so only the launcher's stands between the cache and the forked ranks)."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("peft")
    from trainmath.verify.peft_fsdp import peft_fsdp_step_peak

    d = str(tmp_path / "ck")
    full = run(2, strategy="zero3", peft=ALL)
    cfg = transformers.AutoConfig.for_model(
        "llama", vocab_size=1024, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, head_dim=16)
    try:
        with monkeypatch.context() as m:
            m.setattr(dtensor_state, "forget", lambda: None)
            peft_fsdp_step_peak(cfg, world=2, micro_batch=2, seq=64, precision="fp32", targets="all-linear", rank=4)
        part = run(2, strategy="zero3", peft=ALL, checkpoint_dir=d, stop_after=2)
    finally:
        dtensor_state.forget()
    assert [r["loss"] for r in part[0]["records"]] == [r["loss"] for r in full[0]["records"]][:2]
