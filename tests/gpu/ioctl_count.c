/*
 * ioctl_count.c - counts the ioctl(2) calls a process makes on the GPU
 * driver's device files, independently of ipccache's own counters.
 *
 * Preloaded beside (not instead of) the shim by tests/gpu/run.sh. Every map
 * and unmap the driver really does is a request to the kernel driver, so a
 * cache hit shows up here as "no ioctl", whatever the shim's stats claim.
 * The program under test reads the count through dlsym(RTLD_DEFAULT,
 * "ioctl_count_gpu") when the library is present.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <sys/ioctl.h>

static _Atomic unsigned long gpu_ioctls;
static int (*real_ioctl)(int, unsigned long, void *);

unsigned long ioctl_count_gpu(void);
unsigned long ioctl_count_gpu(void)
{
    return atomic_load(&gpu_ioctls);
}

/* Counts every ioctl: the only ioctl-heavy code in the test programs is the
 * driver's, and reading /proc/self/fd on each call would itself be costly. */
int ioctl(int fd, unsigned long request, ...)
{
    va_list ap;
    va_start(ap, request);
    void *arg = va_arg(ap, void *);
    va_end(ap);
    if (!real_ioctl)
        real_ioctl = (int (*)(int, unsigned long, void *))dlsym(RTLD_NEXT, "ioctl");
    atomic_fetch_add(&gpu_ioctls, 1);
    return real_ioctl(fd, request, arg);
}
