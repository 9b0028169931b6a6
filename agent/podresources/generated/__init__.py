"""Generated kubelet PodResources v1 stubs; do not edit. Regenerate: scripts/gen-podresources.sh."""
