import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"

SLOW_MODULES = {
    # process spawning, gloo ranks, torchrun
    "runtime/test_cli_e2e.py", "runtime/test_collectives.py", "runtime/test_faults.py",
    "robustness/test_processes.py",
    "train/test_cli.py", "train/test_equivalence.py", "train/test_faults.py", "train/test_measure.py",
    "train/test_resume.py", "train/test_selective_train.py", "train/test_verify_math_attention.py",
    "train/test_peft_train.py",
    # browsers, wheel builds
    "viz/test_browser.py", "viz/test_headless.py", "test_wheel.py",
    # long simulations: real modeling code at full width on fake tensors, MemTracker steps, TP/FSDP2 on gloo
    "memory/test_memtracker_oracle.py", "memory/test_fsdp2_oracle.py", "memory/test_tp_oracle.py",
    "memory/test_selective_memtracker.py", "memory/test_fake_experts.py", "memory/test_backward_in_autocast.py",
    "memory/test_peft_memtracker.py", "memory/test_simulate_fold.py", "memory/test_simulate_fold_types.py",
    # more process spawning, live servers and browsers, timing on this CPU
    "train/test_checkpoint_damage.py", "robustness/test_json_sweep.py", "robustness/test_serve_hostile.py",
    "viz/test_browser_serving.py", "infer/test_serving_cpu.py", "viz/test_browser_peft.py",
    "infer/test_serving_loso.py",
}
"""Test modules of the slow tier (``-m slow``); ``-m "not slow"`` is the fast tier for development. CI runs both."""


def pytest_collection_modifyitems(config, items):
    import pytest

    tests = ROOT / "tests"
    for item in items:
        if pathlib.Path(item.fspath).resolve().relative_to(tests).as_posix() in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)
