/*
 * wiring.c - the one place that knows every layer: at load it registers
 * each upper layer's functions with the lower layers that must reach them,
 * so that every call between the library's files goes down (design.md
 * "What is registered, and where"; tests/tools/check_layers.py checks it).
 *
 * Only pointers are stored here: a process that never touches CUDA IPC
 * notices nothing.
 */
#include "entry.h"

/* What a fork child forgets, every layer's in this one list and order (no
 * other fork handler resets anything; design.md "Fork" says why the order).
 * Each touches its own module's state only, safe when that was never used;
 * no CUDA call among them. */
static void (*const fork_resets[])(void) = {
    ipcc_budget_fork_child,           /* first: tables and loans emptied, kept dups closed */
    ipcc_legacy_close_fork_child,
    ipcc_vmm_fork_child,
    ipcc_vmm_identity_fork_child,
    ipcc_legacy_exporter_fork_child,  /* the parent's exports are not the child's to free */
    ipcc_vmm_exporter_fork_child,
    ipcc_vmm_importer_fork_child,
    ipcc_ledger_helper_fork_child,    /* no helper thread here; the slot is the parent's */
    ipcc_stats_fork_child,            /* last: the marker says a child with nothing counted */
};

static const struct ipcc_life_hooks life = {
    .start = ipcc_budget_start,
    .release_idle = ipcc_budget_release_all,
    .fork_child = fork_resets,
    .fork_children = sizeof(fork_resets) / sizeof(fork_resets[0]),
};

/* The idle budget closes what it evicts through the kinds' own closes. */
static const struct ipcc_budget_closers closers = {
    .legacy_taken = ipcc_legacy_close_taken,
    .legacy_run = ipcc_legacy_close_run,
    .vmm_taken = ipcc_vmm_close_taken,
    .vmm_run = ipcc_vmm_close_run,
};

/* Both kinds' bytes still mapped after their exporter freed them. */
static uint64_t ghost_bytes(void)
{
    return ipcc_legacy_ghost_bytes() + ipcc_vmm_ghost_bytes();
}

static const struct ipcc_stats_sources stats = {
    .gauges = ipcc_budget_gauges,
    .top = ipcc_budget_top,
    .ghost_bytes = ghost_bytes,
};

/* First among the library's constructors: the hook table must be known
 * before anything can look a name up or fork. */
__attribute__((constructor(101))) static void wire_layers(void)
{
    ipcc_hooks_register(ipcc_hooks);
    ipcc_life_register(&life);
    ipcc_stats_register(&stats);
    ipcc_budget_register(&closers);
    ipcc_ledger_helper_register(ipcc_vmm_let_go); /* first, as before */
    ipcc_ledger_helper_register(ipcc_legacy_let_go);
}
