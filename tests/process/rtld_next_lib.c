/*
 * rtld_next_lib.c - built twice (WHICH=1, WHICH=2) into two libraries that
 * define the same symbol, to check that dlsym(RTLD_NEXT, ...) is still
 * relative to its real caller while ipccache's dlsym is in front.
 */
#define _GNU_SOURCE
#include <dlfcn.h>

int ipcc_test_which(void);
void *ipcc_test_next_from_lib1(void);

int ipcc_test_which(void)
{
    return WHICH;
}

#if WHICH == 1
/* Asked from library 1, RTLD_NEXT must find library 2's definition. The
 * volatile keeps the compiler from turning the call into a tail jump, which
 * would make this library's caller, not this library, the one asking. */
void *ipcc_test_next_from_lib1(void)
{
    void *volatile found = dlsym(RTLD_NEXT, "ipcc_test_which");
    return found;
}
#endif
