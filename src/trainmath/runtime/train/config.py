"""What one training run is, checked before any rank starts. Pure Python (no torch): the CLI validates here.

The step the ranks run is the calculator's type (``memory.setup.TrainingSetup``, ``TrainConfig.step``): one job,
one description, which ``verify`` predicts as it stands. The batch convention is the calculator's:
``micro_batch`` sequences per data-parallel rank per micro-step, ``grad_accum`` micro-steps per optimizer step
(``TrainingSetup.micro_batches``), so a step consumes ``micro_batch · grad_accum · world_size`` sequences.
``global_batch`` (optional) fixes that product instead, so runs on different world sizes see the same tokens per
step; the world size must divide it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from trainmath.adapters import PeftJob
from trainmath.errors import TrainmathError
from trainmath.memory.setup import TrainingSetup
from trainmath.vocabulary import OPTIMIZER_ALIASES, RECOMPUTE, TRAIN_OPTIMIZERS, TRAIN_PRECISIONS, optimizer_name

STRATEGIES = ("ddp", "zero1", "zero2", "zero3")
IMPLS = ("torch", "trainmath")
PRECISIONS = TRAIN_PRECISIONS
OPTIMIZERS = TRAIN_OPTIMIZERS
OPTIMIZER_IMPLS = ("torch", "trainmath")
COMMS = ("ring", "torch")


ZERO_STAGE = {"ddp": 0, "zero1": 1, "zero2": 2, "zero3": 3}


def run_step(*, micro_batch: int = 1, seq: int = 32, precision: str = "fp32", optimizer: str = "adamw",
             recompute: str = "none", grad_accum: int = 1) -> TrainingSetup:
    """The step ``trainmath train`` runs, from its flags: the runtime's optimizers on the single-tensor path
    (``optimizer_impl="forloop"``: ours are written so, torch's are forced onto it), a loop that keeps only the
    loss (``loss = model(...).loss``)."""
    return TrainingSetup(micro_batch=micro_batch, seq=seq, precision=precision, optimizer=optimizer_name(optimizer),
                         optimizer_impl="forloop", recompute=recompute, micro_batches=grad_accum, loop_keeps="loss")


_TRAIN_SPELLING = {v: k for k, v in OPTIMIZER_ALIASES.items()}


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """One training run (every rank gets the same one): the step, and how the runtime runs it."""

    model: str
    """Catalog name, config.json or directory (see ``trainmath.sources.resolve``)."""
    step: TrainingSetup = field(default_factory=run_step)
    """What each micro-step and step run (``run_step``); ``micro_batch`` is per rank unless ``global_batch``."""
    overrides: dict = field(default_factory=dict)
    """Config keys shrunk by the flags: layers, hidden, intermediate, heads, kv_heads, vocab, experts."""
    strategy: str = "ddp"
    impl: str = "torch"
    comm: str = "ring"
    """Collectives of ``impl=trainmath``: our ring (``trainmath.runtime.ring``) or torch's."""
    optimizer_impl: str = "torch"
    """Whose optimizer code runs the step: torch's or ours (``runtime.train.optim``)."""
    global_batch: int | None = None
    steps: int = 4
    lr: float = 1e-3
    seed: int = 0
    data: str = "synthetic"
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0
    """Save after every k-th step (0: only after the last step when a directory is given)."""
    resume: bool = False
    stop_after: int | None = None
    """Stop after this step (the run is as if interrupted); for resume tests and demos."""
    gpu: str | None = None
    """GPU preset (``trainmath.hardware``) whose dense BF16 peak is MFU's denominator on CUDA; None: guessed from
    the device name."""
    measure: bool = False
    """Measure the bytes of each state, the peak of the first step and its FLOPs (``verify``)."""
    peft: PeftJob = field(default_factory=PeftJob)
    """Fine-tuning job (``--peft lora|qlora``, ``runtime.train.peft``); method none is full training."""

    @classmethod
    def of(cls, *, micro_batch: int = 1, seq: int = 32, precision: str = "fp32", optimizer: str = "adamw",
           recompute: str = "none", grad_accum: int = 1, **run) -> TrainConfig:
        """A run from the CLI's flags: the step's (``run_step``) and the runtime's own (``run``)."""
        return cls(step=run_step(micro_batch=micro_batch, seq=seq, precision=precision, optimizer=optimizer,
                                 recompute=recompute, grad_accum=grad_accum), **run)

    @property
    def zero(self) -> int:
        return ZERO_STAGE[self.strategy]

    # the step's fields, as the runtime reads them
    @property
    def micro_batch(self) -> int:
        return self.step.micro_batch

    @property
    def seq(self) -> int:
        return self.step.seq

    @property
    def precision(self) -> str:
        return self.step.precision

    @property
    def recompute(self) -> str:
        return self.step.recompute

    @property
    def grad_accum(self) -> int:
        return self.step.micro_batches

    @property
    def optimizer(self) -> str:
        """As ``trainmath train --optimizer`` spells it (``TRAIN_OPTIMIZERS``; the step holds its ``OPTIMIZERS``
        name)."""
        return _TRAIN_SPELLING.get(self.step.optimizer, self.step.optimizer)

    def micro_batch_for(self, world_size: int) -> int:
        """Sequences per rank per micro-step on ``world_size`` ranks."""
        if self.global_batch is None:
            return self.micro_batch
        return self.global_batch // (world_size * self.grad_accum)


def _choice(name: str, value, allowed) -> list[str]:
    return [] if value in allowed else [f"--{name} must be one of {', '.join(allowed)}, got {value!r}"]


def problems(cfg: TrainConfig, world_size: int) -> list[str]:
    """Everything wrong with ``cfg`` on ``world_size`` ranks, each naming the value and what is allowed."""
    bad = (_choice("strategy", cfg.strategy, STRATEGIES) + _choice("impl", cfg.impl, IMPLS)
           + _choice("comm", cfg.comm, COMMS) + _choice("precision", cfg.precision, PRECISIONS)
           + _choice("optimizer", cfg.optimizer, OPTIMIZERS)
           + _choice("optimizer-impl", cfg.optimizer_impl, OPTIMIZER_IMPLS)
           + _choice("recompute", cfg.recompute, RECOMPUTE))
    for name in ("seq", "steps", "grad_accum", "micro_batch"):
        v = getattr(cfg, name)
        if not isinstance(v, int) or not 1 <= v <= 2**40:
            bad.append(f"--{name.replace('_', '-')} must be an integer >= 1, got {v!r}")
    if cfg.global_batch is not None:
        per = world_size * cfg.grad_accum
        if cfg.global_batch < 1 or cfg.global_batch % per:
            bad.append(f"--global-batch {cfg.global_batch} is not divisible by world size × grad-accum = "
                       f"{world_size} × {cfg.grad_accum} = {per}")
    if not (isinstance(cfg.lr, (int, float)) and 0 < cfg.lr <= 1e3):  # NaN and infinity fail too
        bad.append(f"--lr must be a finite number in (0, 1000], got {cfg.lr}")
    if cfg.stop_after is not None and (not isinstance(cfg.stop_after, int) or cfg.stop_after < 1):
        bad.append(f"--stop-after must be an integer >= 1, got {cfg.stop_after!r}")
    if cfg.checkpoint_every < 0:
        bad.append(f"--checkpoint-every must be >= 0, got {cfg.checkpoint_every}")
    if cfg.checkpoint_dir:
        bad += _writable_problems(cfg.checkpoint_dir)
    if (cfg.resume or cfg.checkpoint_every) and not cfg.checkpoint_dir:
        bad.append("--resume and --checkpoint-every need --checkpoint-dir")
    if cfg.strategy == "ddp" and cfg.impl == "trainmath":
        bad.append("--strategy ddp has --impl torch only (ours starts at zero1)")
    if cfg.precision == "mixed-bf16" and not (cfg.impl == "torch" and cfg.strategy in ("zero2", "zero3")):
        bad.append("--precision mixed-bf16 (fp32 master weights, bf16 compute) is built on FSDP2's "
                   "MixedPrecisionPolicy: use --strategy zero2|zero3 --impl torch, or fp32|amp-bf16|bf16")
    bad += _peft_problems(cfg)
    for key, v in cfg.overrides.items():
        if not isinstance(v, int) or v < 1:
            bad.append(f"--{key.replace('_', '-')} must be an integer >= 1, got {v!r}")
    if cfg.data != "synthetic":
        if not os.path.isfile(cfg.data):
            bad.append(f"--data {cfg.data!r}: no such file (pass a text file or 'synthetic')")
        elif not os.access(cfg.data, os.R_OK):
            bad.append(f"--data {cfg.data!r}: file is not readable")
    if cfg.gpu is not None:
        from trainmath.hardware import gpu

        try:
            gpu(cfg.gpu)
        except TrainmathError as e:
            bad.append(f"--gpu: {e}")
    return bad


def job_label(job: PeftJob) -> str:
    """The fine-tuning job in one string, as checkpoints record it (resume refuses another one)."""
    if not job.enabled:
        return "none"
    targets = job.targets if isinstance(job.targets, str) else ",".join(job.targets)
    return f"{job.method} r={job.rank} alpha={job.lora_alpha} targets={targets} dtype={job.dtype}"


def _peft_problems(cfg: TrainConfig) -> list[str]:
    """What the runtime cannot do with a fine-tuning job: our ZeRO flattens every parameter (frozen ones too), and
    FSDP2 cannot shard bitsandbytes' packed 4-bit weights (their quant state is not a tensor it can split)."""
    if not cfg.peft.enabled:
        return []
    bad = []
    if cfg.impl == "trainmath":
        bad.append(f"--peft {cfg.peft.method} runs on torch's DDP, ZeroRedundancyOptimizer and FSDP2: use --impl "
                   f"torch (our ZeRO flattens frozen and trainable parameters alike)")
    if cfg.peft.method == "qlora" and cfg.strategy in ("zero2", "zero3"):
        bad.append("--peft qlora: FSDP2 cannot shard bitsandbytes' 4-bit weights; use --strategy ddp or zero1")
    if cfg.peft.method == "qlora" and cfg.precision == "mixed-bf16":
        bad.append("--peft qlora with --precision mixed-bf16 needs FSDP2; use fp32, amp-bf16 or bf16")
    return bad


def _writable_problems(directory: str) -> list[str]:
    """Whether checkpoints can be written under ``directory``, found before step 1 (not after training): the path
    or its nearest existing ancestor must be a folder where a folder can be made (a probe folder is made there
    and removed at once)."""
    import tempfile

    where = os.path.abspath(directory)
    while not os.path.lexists(where):
        where = os.path.dirname(where)
    if not os.path.isdir(where):
        return [f"--checkpoint-dir {directory!r}: {where} is not a folder"]
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".trainmath-probe-", dir=where))
    except OSError as e:
        return [f"--checkpoint-dir {directory!r}: cannot write in {where}: {e.strerror or e}"]
    return []


def validate(cfg: TrainConfig, world_size: int) -> TrainConfig:
    bad = problems(cfg, world_size)
    if bad:
        raise TrainmathError("; ".join(bad))
    return cfg
