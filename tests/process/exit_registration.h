/*
 * exit_registration.h - for the preloaded test libraries that widen an
 * allocation inside glibc's registration of an exit handler (window_lib.c,
 * alloc_lock_lib.c): which thread is inside one, and how to make the next
 * one allocate. Each library counts, in its own calloc, the allocations
 * made while in_registration is set.
 */
#ifndef EXIT_REGISTRATION_H
#define EXIT_REGISTRATION_H

#include <dlfcn.h>
#include <stdlib.h>

static __thread int in_registration;

__attribute__((visibility("default"))) int __cxa_atexit(void (*fn)(void *), void *arg, void *dso)
{
    static int (*real)(void (*)(void *), void *, void *);
    if (!real)
        real = (int (*)(void (*)(void *), void *, void *))dlsym(RTLD_NEXT, "__cxa_atexit");
    in_registration++;
    int rc = real(fn, arg, dso);
    in_registration--;
    return rc;
}

static void exit_registration_nothing(void)
{
}

/* Registers exit handlers until glibc's list has just filled a block (of
 * 32): the next registration allocates. allocs() is the library's count.
 * -1 if none allocated (not glibc's layout). */
static int fill_exit_block(long (*allocs)(void))
{
    for (int i = 0; i < 100; i++) {
        long before = allocs();
        atexit(exit_registration_nothing);
        if (allocs() != before) {
            for (int j = 1; j < 32; j++)
                atexit(exit_registration_nothing);
            return 0;
        }
    }
    return -1;
}

#endif
