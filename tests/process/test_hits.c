/*
 * test_hits.c - the cache keeps the driver's contract: hits return the
 * driver's pointer without a driver call, closes keep mappings idle, and
 * every error is the driver's own.
 */
#include "testutil.h"

/* A second open of one handle is served from the cache: same pointer, no map. */
Test(hits, second_open_is_a_hit, .timeout = 10)
{
    tu_context();
    CUipcMemHandle h = tu_handle(1, 1 << 20);
    CUdeviceptr a = tu_open(h);
    tu_close(a);
    CUdeviceptr b = tu_open(h);
    cr_assert_eq(a, b);
    cr_assert_eq(tu_driver().maps, 1);
    cr_assert_eq(tu_driver().open_calls, 1);
    tu_close(b);
}

/* After the application closes, the mapping stays: the driver still holds it once. */
Test(hits, close_keeps_mapping_idle, .timeout = 10)
{
    tu_context();
    CUdeviceptr p = tu_open(tu_handle(2, 4096));
    tu_close(p);
    cr_assert_eq(tu_driver().unmaps, 0);
    cr_assert_eq(fakecuda_refcount(NULL, p), 1);
    cr_assert_eq(tu_driver().close_calls, 0);
}

/* Nested opens count references like the driver: two opens need two closes. */
Test(hits, nested_opens_need_as_many_closes, .timeout = 10)
{
    tu_context();
    CUipcMemHandle h = tu_handle(3, 4096);
    CUdeviceptr a = tu_open(h), b = tu_open(h);
    cr_assert_eq(a, b);
    cr_assert_eq(tu_driver().open_calls, 1, "the second open is the cache's");
    tu_close(a);
    tu_close(b);
    cr_assert_eq(fakecuda_refcount(NULL, a), 1, "the driver keeps exactly one reference");
    cr_assert_eq(cuIpcCloseMemHandle(a), CUDA_ERROR_INVALID_VALUE);
    cr_assert_eq(fakecuda_refcount(NULL, a), 0, "past zero, nothing stays mapped");
}

/* Different handles get different mappings. */
Test(hits, distinct_handles_distinct_mappings, .timeout = 10)
{
    tu_context();
    CUdeviceptr a = tu_open(tu_handle(4, 4096));
    CUdeviceptr b = tu_open(tu_handle(5, 4096));
    cr_assert_neq(a, b);
    cr_assert_eq(tu_driver().maps, 2);
}

/* The v1 and v2 entry points share one cache (the same driver mapping). */
Test(hits, v1_and_v2_share_entries, .timeout = 10)
{
    tu_context();
    CUipcMemHandle h = tu_handle(6, 4096);
    CUdeviceptr a = 0, b = 0;
    cr_assert_eq(cuIpcOpenMemHandle_v2(&a, h, 1), CUDA_SUCCESS);
    CUresult (*v1)(CUdeviceptr *, CUipcMemHandle, unsigned) =
        (CUresult(*)(CUdeviceptr *, CUipcMemHandle, unsigned))dlsym(RTLD_DEFAULT, "cuIpcOpenMemHandle");
    cr_assert_not_null(v1);
    cr_assert_eq(v1(&b, h, 1), CUDA_SUCCESS);
    cr_assert_eq(a, b);
    cr_assert_eq(tu_driver().maps, 1);
    cr_assert_eq(tu_driver().open_calls, 1, "the v1 open is a hit");
}

/* The same handle in contexts of two devices is two mappings, each in its own context. */
Test(hits, contexts_do_not_share, .timeout = 10)
{
    CUcontext c1 = tu_context();
    CUipcMemHandle h = tu_handle(7, 4096);
    CUdeviceptr a = tu_open(h);
    tu_close(a);
    CUcontext c2 = NULL;
    cr_assert_eq(cuCtxCreate_v2(&c2, 0, 1), CUDA_SUCCESS);
    cr_assert_neq(c1, c2);
    CUdeviceptr b = tu_open(h);
    cr_assert_eq(tu_driver().maps, 2);
    cr_assert_eq(fakecuda_refcount(c2, b), 1);
    cr_assert_eq(fakecuda_refcount(c1, a), 1);
}

/* A double close past zero gives what the driver gives: INVALID_VALUE. */
Test(hits, double_close_is_invalid_value, .timeout = 10)
{
    tu_context();
    CUdeviceptr p = tu_open(tu_handle(8, 4096));
    tu_close(p);
    cr_assert_eq(cuIpcCloseMemHandle(p), CUDA_ERROR_INVALID_VALUE);
    cr_assert_eq(fakecuda_refcount(NULL, p), 0, "unmapped, as by the driver alone");
    cr_assert_eq(tu_driver().unmaps, 1);
}

/* A pointer the cache never saw goes to the driver, whose answer comes back. */
Test(hits, unknown_pointer_is_the_drivers_answer, .timeout = 10)
{
    tu_context();
    cr_assert_eq(cuIpcCloseMemHandle(0x1234500), CUDA_ERROR_INVALID_VALUE);
    cr_assert_eq(tu_driver().close_calls, 1);
}

/* A zero handle is refused by the driver, and never cached. */
Test(hits, zero_handle_is_invalid_value, .timeout = 10)
{
    tu_context();
    CUipcMemHandle zero;
    memset(&zero, 0, sizeof(zero));
    CUdeviceptr p = 0;
    cr_assert_eq(cuIpcOpenMemHandle(&p, zero, 1), CUDA_ERROR_INVALID_VALUE);
    cr_assert_eq(cuIpcOpenMemHandle(&p, zero, 1), CUDA_ERROR_INVALID_VALUE);
    cr_assert_eq(tu_driver().open_calls, 2);
}

/* Flags 0 are refused even for a handle that is cached with valid flags. */
Test(hits, flags_zero_refused_even_when_cached, .timeout = 10)
{
    tu_context();
    CUipcMemHandle h = tu_handle(9, 4096);
    CUdeviceptr p = tu_open(h), q = 0;
    tu_close(p);
    cr_assert_eq(cuIpcOpenMemHandle(&q, h, 0), CUDA_ERROR_INVALID_VALUE);
    cr_assert_eq(q, 0);
}

/* Without a current context both calls return the driver's 201. */
Test(hits, no_context_is_the_drivers_error, .timeout = 10)
{
    CUdeviceptr p = 0;
    cr_assert_eq(cuInit(0), CUDA_SUCCESS);
    cr_assert_eq(cuIpcOpenMemHandle(&p, tu_handle(10, 4096), 1), CUDA_ERROR_INVALID_CONTEXT);
    cr_assert_eq(cuIpcCloseMemHandle(0x1000), CUDA_ERROR_INVALID_CONTEXT);
}

/* Opening our own export fails in the driver (201) and is not cached. */
Test(hits, own_export_is_the_drivers_error, .timeout = 10)
{
    tu_context();
    CUdeviceptr mine = 0, p = 0;
    CUipcMemHandle h;
    cr_assert_eq(cuMemAlloc_v2(&mine, 1 << 20), CUDA_SUCCESS);
    cr_assert_eq(cuIpcGetMemHandle(&h, mine), CUDA_SUCCESS);
    cr_assert_eq(cuIpcOpenMemHandle(&p, h, 1), CUDA_ERROR_INVALID_CONTEXT);
    cr_assert_eq(cuIpcOpenMemHandle(&p, h, 1), CUDA_ERROR_INVALID_CONTEXT);
}

/* A NULL output pointer goes to the driver even for a cached handle. */
Test(hits, null_output_is_the_drivers_error, .timeout = 10)
{
    tu_context();
    CUipcMemHandle h = tu_handle(11, 4096);
    tu_close(tu_open(h));
    cr_assert_eq(cuIpcOpenMemHandle(NULL, h, 1), CUDA_ERROR_INVALID_VALUE);
}

/* A new allocation (new handle) is a new mapping, never the old one's. */
Test(hits, new_allocation_is_a_miss, .timeout = 10)
{
    tu_context();
    CUdeviceptr a = tu_open(tu_handle(12, 4096));
    tu_close(a);
    CUdeviceptr b = tu_open(tu_handle(13, 4096));
    cr_assert_eq(tu_driver().maps, 2);
    cr_assert_neq(a, b);
}

/* An idle cached mapping in another context of the same device must not make
 * an open fail that the driver allows without the cache: it is closed. */
Test(hits, idle_mapping_elsewhere_on_device_gives_way, .timeout = 10)
{
    CUcontext c1 = tu_context();
    CUipcMemHandle h = tu_handle(14, 4096);
    CUdeviceptr a = tu_open(h);
    tu_close(a);
    CUcontext c2 = NULL;
    cr_assert_eq(cuCtxCreate_v2(&c2, 0, 0), CUDA_SUCCESS);
    CUdeviceptr b = tu_open(h);
    cr_assert_eq(fakecuda_refcount(c1, a), 0, "the idle mapping in c1 was closed");
    cr_assert_eq(fakecuda_refcount(c2, b), 1);
}

/* A live mapping in another context of the same device fails the open as
 * the driver does without the cache (one context per device per exporter). */
Test(hits, live_mapping_elsewhere_on_device_is_the_drivers_error, .timeout = 10)
{
    CUcontext c1 = tu_context();
    CUipcMemHandle h = tu_handle(15, 4096);
    CUdeviceptr a = tu_open(h);
    CUcontext c2 = NULL;
    cr_assert_eq(cuCtxCreate_v2(&c2, 0, 0), CUDA_SUCCESS);
    CUdeviceptr b = 0;
    cr_assert_eq(cuIpcOpenMemHandle(&b, h, 1), CUDA_ERROR_INVALID_HANDLE);
    cr_assert_eq(fakecuda_refcount(c1, a), 1);
}

/* ---- one mapping, several ways to reach it ------------------------------ */

static CUipcMemHandle export_of(uint64_t serial, uint64_t nonce)
{
    CUipcMemHandle h;
    fakecuda_make_foreign_export(&h, serial, 4096, nonce);
    return h;
}

/* Two exports of one allocation (different bytes, one mapping) hold one
 * driver reference between them, and need as many closes as opens. */
Test(hits, two_exports_of_one_allocation_share_one_reference, .timeout = 10)
{
    tu_context();
    CUipcMemHandle h1 = export_of(50, 1), h2 = export_of(50, 2);
    cr_assert_neq(memcmp(&h1, &h2, sizeof(h1)), 0);
    CUdeviceptr a = tu_open(h1), b = tu_open(h2), c = tu_open(h2);
    cr_assert_eq(a, b);
    cr_assert_eq(b, c);
    cr_assert_eq(tu_driver().open_calls, 2, "the second export is a miss, then a hit");
    cr_assert_eq(fakecuda_refcount(NULL, a), 1, "one reference, the cache's");
    tu_close(a);
    tu_close(a);
    tu_close(a);
    cr_assert_eq(cuIpcCloseMemHandle(a), CUDA_ERROR_INVALID_VALUE);
    cr_assert_eq(fakecuda_refcount(NULL, a), 0);
}

/* Handles that differ only in bytes 32-63 name different allocations: the
 * whole handle is the key. */
Test(hits, handles_differing_only_in_the_upper_half_are_distinct, .timeout = 10)
{
    tu_context();
    CUipcMemHandle h1 = tu_handle(51, 4096), h2 = tu_handle(52, 4096);
    cr_assert_eq(memcmp(&h1, &h2, 32), 0, "the stand-in's lower halves match");
    CUdeviceptr a = tu_open(h1), b = tu_open(h2);
    cr_assert_neq(a, b);
    cr_assert_eq(tu_driver().maps, 2);
}

/* A handle equal to a cached one but for its last byte is the driver's to
 * judge (the stand-in refuses it). */
Test(hits, handle_differing_in_its_last_byte_is_the_drivers_error, .timeout = 10)
{
    tu_context();
    CUipcMemHandle h = tu_handle(53, 4096);
    tu_close(tu_open(h));
    h.reserved[CU_IPC_HANDLE_SIZE - 1] ^= 1;
    CUdeviceptr p = 0;
    cr_assert_eq(cuIpcOpenMemHandle(&p, h, 1), CUDA_ERROR_INVALID_VALUE);
    cr_assert_eq(tu_driver().open_calls, 2);
}

/* A reference opened past the cache (a library bound to the driver itself)
 * may be closed through it: the driver's answer, and nothing left mapped. */
Test(hits, reference_opened_past_the_cache_closes_through_it, .timeout = 10)
{
    tu_context();
    CUipcMemHandle h = tu_handle(54, 4096);
    CUdeviceptr direct = 0;
    cr_assert_eq(fakecuda_ipc_open_direct(&direct, h, 1), CUDA_SUCCESS);
    CUdeviceptr p = tu_open(h);
    cr_assert_eq(p, direct);
    tu_close(p);
    cr_assert_eq(cuIpcCloseMemHandle(direct), CUDA_SUCCESS, "the direct open's close");
    cr_assert_eq(fakecuda_refcount(NULL, p), 0);
    cr_assert_eq(tu_driver().unmaps, 1);
    cr_assert_eq(cuIpcCloseMemHandle(p), CUDA_ERROR_INVALID_VALUE);
}

/* A cached mapping also opened past the cache and closed there keeps the
 * cache's reference: the application's next open is still a hit. */
Test(hits, reference_opened_and_closed_past_the_cache, .timeout = 10)
{
    tu_context();
    CUipcMemHandle h = tu_handle(55, 4096);
    CUdeviceptr p = tu_open(h), direct = 0;
    cr_assert_eq(fakecuda_ipc_open_direct(&direct, h, 1), CUDA_SUCCESS);
    cr_assert_eq(fakecuda_ipc_close_direct(direct), CUDA_SUCCESS);
    tu_close(p);
    cr_assert_eq(tu_open(h), p);
    cr_assert_eq(fakecuda_refcount(NULL, p), 1);
    cr_assert_eq(tu_driver().maps, 1);
}

/* Without cuCtxGetId (drivers before 12.0) nothing is cached: every open
 * and close is the driver's own. */
Test(hits, without_context_ids_every_call_reaches_the_driver, .timeout = 10)
{
    setenv("FAKECUDA_NO_CTXGETID", "1", 1);
    tu_context();
    CUipcMemHandle h = tu_handle(56, 4096);
    CUdeviceptr a = tu_open(h), b = tu_open(h);
    cr_assert_eq(a, b);
    tu_close(a);
    tu_close(b);
    cr_assert_eq(tu_driver().open_calls, 2);
    cr_assert_eq(tu_driver().close_calls, 2);
    cr_assert_eq(tu_driver().maps, 1);
    cr_assert_eq(tu_driver().unmaps, 1);
    cr_assert_eq(cuIpcCloseMemHandle(a), CUDA_ERROR_INVALID_VALUE);
}

/* A thread remembers its last hit; once that entry has left the table (here
 * by a close past zero), the next open of the handle is a real one again. */
Test(hits, remembered_hit_gone_from_the_table_is_a_miss, .timeout = 10)
{
    tu_context();
    CUipcMemHandle h = tu_handle(40, 4096);
    tu_close(tu_open(h));
    CUdeviceptr p = tu_open(h); /* a hit: now remembered */
    tu_close(p);
    cr_assert_eq(cuIpcCloseMemHandle(p), CUDA_ERROR_INVALID_VALUE, "past zero: the driver's answer");
    cr_assert_eq(fakecuda_refcount(NULL, p), 0);
    CUdeviceptr q = tu_open(h);
    cr_assert_eq(tu_driver().open_calls, 2, "the removed entry was handed out again");
    cr_assert_eq(fakecuda_refcount(NULL, q), 1);
    tu_close(q);
}

/* A close of another mapping than the one last hit is counted on its own
 * entry, not on the remembered one. */
Test(hits, close_of_another_mapping_counts_on_its_own_entry, .timeout = 10)
{
    tu_context();
    CUdeviceptr a = tu_open(tu_handle(41, 4096));
    CUdeviceptr b = tu_open(tu_handle(42, 4096)); /* remembered */
    tu_close(a);
    tu_close(b);
    cr_assert_eq(cuIpcCloseMemHandle(a), CUDA_ERROR_INVALID_VALUE);
    cr_assert_eq(cuIpcCloseMemHandle(b), CUDA_ERROR_INVALID_VALUE);
    cr_assert_eq(fakecuda_refcount(NULL, a), 0);
    cr_assert_eq(fakecuda_refcount(NULL, b), 0);
}
