/* common/cublas_lazy.c: a CUDA build does not load cuBLAS at start-up, and
 * loads it, with every function the kernels call, on first use. Runs without
 * a GPU: cublasGetStatusString needs none. */
#include <cublas_v2.h>
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

static int loaded(void) { /* is libcublas in the process? */
    void *h = dlopen(PL_CUBLAS_SONAME, RTLD_NOW | RTLD_NOLOAD);
    if (h) dlclose(h);
    return h != NULL;
}

int main(void) {
    int failures = 0;
    if (loaded()) { printf("FAIL: cuBLAS is loaded at start-up\n"); failures++; }
    const char *s = cublasGetStatusString(CUBLAS_STATUS_SUCCESS);
    if (!s || strcmp(s, "success") != 0) { printf("FAIL: cublasGetStatusString gave %s\n", s ? s : "NULL"); failures++; }
    if (!loaded()) { printf("FAIL: cuBLAS is not loaded after a call\n"); failures++; }
    /* the kernels' other six, as the shim looks them up */
    const char *names[] = {"cublasCreate_v2", "cublasSetStream_v2", "cublasSgemm_v2", "cublasGemmEx",
                           "cublasSgemmStridedBatched", "cublasGemmStridedBatchedEx"};
    void *lib = dlopen(PL_CUBLAS_SONAME, RTLD_NOW | RTLD_NOLOAD);
    for (int i = 0; i < 6; i++)
        if (!lib || !dlsym(lib, names[i])) { printf("FAIL: %s not in %s\n", names[i], PL_CUBLAS_SONAME); failures++; }
    printf("cuBLAS: not loaded at start-up, loaded by the first call (%s), its 7 functions found: %d failures\n", s,
           failures);
    return failures ? 1 : 0;
}
