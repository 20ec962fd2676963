"""DeepSpeed's own model-state memory estimators, transcribed for the tests (CI does not install deepspeed).

Transcribed from deepspeed 0.19.8 (the PyPI release): ``estimate_zero2_model_states_mem_needs`` in
``deepspeed/runtime/zero/stage_1_and_2.py`` and ``estimate_zero3_model_states_mem_needs`` in
``deepspeed/runtime/zero/stage3.py``; ``test_host.py`` compares them with the installed functions where deepspeed
is importable. Both return (cpu_mem, gpu_mem) in bytes: cpu_mem is per node (each node's host), gpu_mem per GPU.
Their ``_all_live`` / ``_all_cold`` wrappers print ``cpu_mem / 2**30`` with "GB".
"""

from __future__ import annotations


def zero2_mem_needs(total_params: int, num_gpus_per_node: int = 1, num_nodes: int = 1, cpu_offload: bool = True,
                    additional_buffer_factor: float = 1.5) -> tuple[int, int]:
    total_gpus = num_nodes * num_gpus_per_node
    if cpu_offload:
        gpu_mem = 2 * total_params
        cpu_mem = total_params * max(4 * total_gpus, 16) * additional_buffer_factor
    else:
        gpu_mem = 2 * total_params + int(18 * total_params / total_gpus)
        cpu_mem = total_params * 4 * num_gpus_per_node * additional_buffer_factor
    return int(cpu_mem), int(gpu_mem)


def zero3_mem_needs(total_params: int, largest_layer_params: int, num_gpus_per_node: int = 1, num_nodes: int = 1,
                    cpu_offload: bool = True, cpu_offload_params: bool = True, zero_init: bool = True,
                    additional_buffer_factor: float = 1.5) -> tuple[int, int]:
    total_gpus = num_nodes * num_gpus_per_node
    gpus_factor = 1 / num_nodes
    largest_layer_memory = 4 * largest_layer_params
    if cpu_offload:
        if cpu_offload_params:
            gpu_mem = largest_layer_memory
            if zero_init:
                cpu_mem = total_params * 18 * gpus_factor * additional_buffer_factor
            else:
                cpu_mem = total_params * max(4 * num_gpus_per_node, 18 * gpus_factor) * additional_buffer_factor
        else:
            gpu_mem = largest_layer_memory + int(2 * total_params / total_gpus)
            if zero_init:
                cpu_mem = total_params * 16 * gpus_factor * additional_buffer_factor
            else:
                cpu_mem = total_params * max(4 * num_gpus_per_node, 16 * gpus_factor) * additional_buffer_factor
    else:
        gpu_mem = largest_layer_memory + int(18 * total_params / total_gpus)
        if zero_init:
            cpu_mem = largest_layer_params * 4 * num_gpus_per_node * additional_buffer_factor
        else:
            cpu_mem = total_params * 4 * num_gpus_per_node * additional_buffer_factor
    return int(cpu_mem), int(gpu_mem)
