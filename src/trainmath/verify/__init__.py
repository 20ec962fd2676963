"""What compares the calculator with torch: the real modeling code on fake tensors (``simulate``, ``fake_experts``)
and a measured training run against its prediction (``train``). Stands above both wings; torch is imported lazily."""
