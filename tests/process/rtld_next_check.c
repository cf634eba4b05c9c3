/*
 * rtld_next_check.c - a stand-alone check that RTLD_NEXT keeps its meaning
 * with ipccache's dlsym preloaded, for architectures whose tests run under
 * an emulator without Criterion. Linked with libnext1 and libnext2 (two
 * libraries defining ipcc_test_which); exits 0 when all holds.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

int ipcc_test_which(void);
void *ipcc_test_next_from_lib1(void);

static int check(const char *what, int ok)
{
    printf("%s=%d\n", what, ok);
    return ok ? 0 : 1;
}

int main(void)
{
    int (*from_lib1)(void) = (int (*)(void))ipcc_test_next_from_lib1();
    int (*from_program)(void) = (int (*)(void))dlsym(RTLD_NEXT, "ipcc_test_which");
    int bad = 0;
    bad |= check("next_from_library", from_lib1 && from_lib1() == 2);
    bad |= check("next_from_program", from_program && from_program() == 1);
    bad |= check("default_lookup", dlsym(RTLD_DEFAULT, "malloc") == (void *)malloc);
    bad |= check("hooked_name", dlsym(RTLD_DEFAULT, "cuIpcOpenMemHandle_v2") != NULL);
    return bad;
}
