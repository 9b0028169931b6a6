"""The scheduler's books: what the kubelet gave each device, holder pods and
pins that count a hot-mounted GPU, DRA, and double booking."""
