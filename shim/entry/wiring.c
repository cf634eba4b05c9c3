/*
 * wiring.c - the one place that knows every layer: at load it registers
 * each upper layer's functions with the lower layers that must reach them,
 * so that every call between the library's files goes down (README "Files",
 * docs/design.md; tests/check_layers.py checks it).
 *
 * Only pointers are stored here: a process that never touches CUDA IPC
 * notices nothing.
 */
#include "internal.h"

/* First among the library's constructors: the hook table must be known
 * before anything can look a name up or fork. */
__attribute__((constructor(101))) static void wire_layers(void)
{
    ipcc_hooks_register(ipcc_hooks);
}
