/*
 * test_mem.c - the tables' own memory (shim/base/mem.c) alone: blocks from
 * pages of its own, and what it says it holds (the stats' mem_bytes).
 */
#include <criterion/criterion.h>
#include <string.h>

#include "mem.h"

TestSuite(mem, .timeout = 10);

Test(mem, large_block_goes_back_to_the_system)
{
    /* A block past 64 KiB is a mapping of its own: its free unmaps it and mem_bytes drops by it (the first form read the block's size after the unmap: a crash at a table's first bucket array past 64 KiB). */
    size_t before = ipcc_mem_mapped();
    char *p = ipcc_mem_alloc(1 << 20);
    cr_assert_not_null(p);
    memset(p, 0x5a, 1 << 20);
    cr_assert_geq(ipcc_mem_mapped(), before + (1 << 20));
    ipcc_mem_free(p);
    cr_assert_eq(ipcc_mem_mapped(), before);
}

Test(mem, small_blocks_stay_on_their_lists)
{
    /* Small blocks come from regions of 1 MiB and wait on a free list: mem_bytes is the most ever needed. */
    void *p[64];
    for (int i = 0; i < 64; i++)
        cr_assert_not_null(p[i] = ipcc_mem_alloc(4096));
    size_t peak = ipcc_mem_mapped();
    cr_assert_geq(peak, 64 * 4096);
    for (int i = 0; i < 64; i++)
        ipcc_mem_free(p[i]);
    cr_assert_eq(ipcc_mem_mapped(), peak);
    for (int i = 0; i < 64; i++)
        cr_assert_not_null(p[i] = ipcc_mem_alloc(4096));
    cr_assert_eq(ipcc_mem_mapped(), peak, "freed blocks were not reused");
    for (int i = 0; i < 64; i++)
        ipcc_mem_free(p[i]);
}
