"""Generated device plugin v1beta1 stubs; do not edit. Regenerate: tests/k8s/deviceplugin/generate.sh."""
