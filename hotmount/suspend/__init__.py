"""Suspend and resume: a container's GPUs taken away through CUDA's checkpoint API,
its processes kept alive, and given back (the same GPU or one of the same model).

- cuda.py: the node's own libcuda.so.1, called in killable children;
- memory.py: room in the container's memory cgroup for the GPU memory that lands there;
- nvml.py: who has a context on the GPUs, and how much GPU memory each holds;
- choose.py: pure decisions (driver versions, which GPU a resume goes onto);
- model.py: what they answer;
- flow.py: the steps, recorded in the ledger before each one, and their repair.
"""
