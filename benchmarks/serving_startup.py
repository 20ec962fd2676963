"""CPU time of the serving commands, as a user pays it (a fresh process each): `trainmath infer` with speed for
every catalog model (target < 1 s), and `trainmath infer-plan` on a dense, an MoE and an MLA model (target < 2 s).

    python benchmarks/serving_startup.py
"""

from __future__ import annotations

import resource
import subprocess
import sys


def cpu_s(argv: list[str]) -> tuple[float, int]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    rc = subprocess.run([sys.executable, "-m", "trainmath", *argv], capture_output=True).returncode
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, rc


def main() -> int:
    from trainmath.sources import catalog_index

    worst = (0.0, "")
    print(f"{'command':<90} {'CPU s':>6} {'rc':>3}")
    for name in sorted(catalog_index()):
        argv = ["infer", name, "--gpu", "h100", "--batch", "8", "--input", "1024", "--output", "256", "--json"]
        t, rc = cpu_s(argv)
        worst = max(worst, (t, name))
        print(f"{' '.join(argv[:2]) + ' ... (batch 8, 1024 in / 256 out)':<90} {t:>6.2f} {rc:>3}")
    print(f"infer with speed: worst {worst[0]:.2f} s CPU ({worst[1]}), target < 1 s")
    for name in ("meta-llama/Llama-3.1-70B", "Qwen/Qwen3-30B-A3B", "deepseek-ai/DeepSeek-V3"):
        argv = ["infer-plan", name, "--gpu", "h200", "--qps", "20", "--input", "1000", "--output", "500",
                "--ttft-slo", "1", "--tpot-slo", "0.05"]
        t, rc = cpu_s(argv)
        print(f"{' '.join(argv):<90} {t:>6.2f} {rc:>3}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
