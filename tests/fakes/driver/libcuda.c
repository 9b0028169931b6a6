/* A stand-in libcuda.so.<version>: a library with the soname libcuda.so.1, nothing more. */
int cuInit(unsigned int flags) { return flags == 0 ? 0 : 1; }
