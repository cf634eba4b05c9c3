/*
 * glibc_floor.h - binds the library to the oldest glibc symbol versions, so
 * that one build loads on every glibc since 2.17 (manylinux2014: RHEL 8,
 * Ubuntu 20.04 and the CUDA images built on them), not only on the glibc it
 * was built with. Forced into every shipped object with -include.
 *
 * glibc 2.34 moved libdl and libpthread into libc and gave the moved
 * functions a new version (GLIBC_2.34); the old versions are the same
 * functions and stay in every later glibc. Nothing else the library calls is
 * newer than 2.17 (clock_gettime). The wheel test reads the built library's
 * version needs: a new call to a newer function shows up there, and belongs
 * here if an old version of it exists.
 *
 * dlsym is not listed: the library defines its own.
 */
#ifndef IPCC_GLIBC_FLOOR_H
#define IPCC_GLIBC_FLOOR_H

#if defined(__x86_64__)
#define IPCC_GLIBC_FLOOR "GLIBC_2.2.5"
#define IPCC_GLIBC_DLADDR1 "GLIBC_2.3.3"   /* dladdr1 came later than the rest */
#elif defined(__aarch64__)
#define IPCC_GLIBC_FLOOR "GLIBC_2.17"
#define IPCC_GLIBC_DLADDR1 "GLIBC_2.17"
#endif

#if defined(IPCC_GLIBC_FLOOR) && defined(__linux__)
#define IPCC_OLD_VERSION(fn) __asm__(".symver " #fn "," #fn "@" IPCC_GLIBC_FLOOR)
IPCC_OLD_VERSION(dladdr);
IPCC_OLD_VERSION(dlclose);
IPCC_OLD_VERSION(dlerror);
IPCC_OLD_VERSION(dlopen);
IPCC_OLD_VERSION(dlvsym);
IPCC_OLD_VERSION(pthread_create);
IPCC_OLD_VERSION(pthread_detach);
IPCC_OLD_VERSION(pthread_getcpuclockid);
IPCC_OLD_VERSION(pthread_mutex_trylock);
IPCC_OLD_VERSION(pthread_once);
IPCC_OLD_VERSION(pthread_sigmask);
IPCC_OLD_VERSION(pthread_key_create);
IPCC_OLD_VERSION(pthread_getspecific);
IPCC_OLD_VERSION(pthread_setspecific);
__asm__(".symver dladdr1,dladdr1@" IPCC_GLIBC_DLADDR1);
#undef IPCC_OLD_VERSION
#endif

#endif
