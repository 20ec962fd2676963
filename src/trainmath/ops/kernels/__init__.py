"""One module per kind of op: each function appends the ops one module of the model code runs, with what each
saves, to a ``Program``. Kernels never name a model family; families choose kernels through their table row
(``trainmath.families``)."""
