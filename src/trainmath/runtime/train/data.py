"""Token batches: sample ``i`` of the run is the same tensor whatever the world size, so runs on 1, 2 or 4 ranks
at equal tokens per step see the same data, and a resumed run continues where the interrupted one stopped.

A step consumes the next G global samples (G sequences per step) after the ``s`` already consumed (the data
position, kept in checkpoints). Micro-step m of rank r takes the ``B`` samples starting at ``s + (m·W + r)·B``:
each rank reads its own shard of the step.

- ``synthetic``: sample i is an arithmetic sequence ``(a + j·d) mod V`` with a, d drawn from a generator seeded
  by (seed, i): learnable, so the loss falls.
- a text file: its bytes are the tokens (a byte-level tokenizer, vocabulary 256, needs no download); sample i is
  the window of ``seq`` bytes at offset ``i·seq`` modulo the file length.
"""

from __future__ import annotations

import torch

from trainmath.errors import TrainmathError


class TokenSource:
    def __init__(self, data: str, *, vocab: int, seq: int, seed: int):
        self.seq, self.vocab, self.seed = seq, vocab, seed
        self.text: torch.Tensor | None = None
        if data != "synthetic":
            try:
                with open(data, "rb") as f:
                    raw = f.read()
            except OSError as e:
                raise TrainmathError(f"cannot read --data {data!r}: {e.strerror}") from None
            if len(raw) < seq + 1:
                raise TrainmathError(f"--data {data!r} holds {len(raw)} bytes; --seq {seq} needs at least {seq + 1}")
            if vocab < 256:
                raise TrainmathError(f"byte-level text needs --vocab >= 256, got {vocab}")
            self.text = torch.frombuffer(bytearray(raw), dtype=torch.uint8).to(torch.long)

    def sample(self, i: int) -> torch.Tensor:
        """Global sample ``i``: (seq,) token ids."""
        if self.text is not None:
            span = self.text.numel() - self.seq
            start = (i * self.seq) % span
            return self.text[start:start + self.seq]
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        a, d = torch.randint(0, self.vocab, (2,), generator=g).tolist()
        return (a + torch.arange(self.seq) * (d % 7 + 1)) % self.vocab

    def micro_batch(self, step_start: int, micro: int, *, rank: int, world_size: int, batch: int
                    ) -> torch.Tensor:
        """(batch, seq) token ids of micro-step ``micro`` on ``rank`` of the step whose first global sample is
        ``step_start`` (the samples consumed before it: the data position a checkpoint keeps)."""
        first = step_start + (micro * world_size + rank) * batch
        return torch.stack([self.sample(first + j) for j in range(batch)])
