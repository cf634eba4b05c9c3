/*
 * dlsym_aarch64.S - the exported dlsym, for 64-bit Arm (e.g. Grace Hopper).
 *
 * Same contract as dlsym_x86_64.S: glibc reads the caller's return address
 * (x30 on entry) to decide what RTLD_NEXT means, so after asking
 * ipcc_dlsym_hook(handle, name, x30) we either return its answer or restore x0,
 * x1 and x30 exactly as the caller left them and branch - not branch with
 * link - to the real dlsym.
 */
#if defined(__aarch64__)

    .text
    .globl  dlsym
    .type   dlsym, %function
    .p2align 2
dlsym:
    .cfi_startproc
#if defined(__ARM_FEATURE_BTI_DEFAULT)
    hint    #34                      /* bti c */
#endif
    stp     x29, x30, [sp, #-32]!
    .cfi_def_cfa_offset 32
    .cfi_offset 29, -32
    .cfi_offset 30, -24
    mov     x29, sp
    stp     x0, x1, [sp, #16]
    mov     x2, x30                  /* who is asking */
    bl      ipcc_dlsym_hook
    cbnz    x0, 1f
    ldp     x0, x1, [sp, #16]
    ldp     x29, x30, [sp], #32
    .cfi_remember_state
    .cfi_restore 29
    .cfi_restore 30
    .cfi_def_cfa_offset 0
    adrp    x16, ipcc_real_dlsym     /* set by ipcc_dlsym_hook */
    ldr     x16, [x16, :lo12:ipcc_real_dlsym]
    br      x16
1:
    .cfi_restore_state
    ldp     x29, x30, [sp], #32
    .cfi_restore 29
    .cfi_restore 30
    .cfi_def_cfa_offset 0
    ret
    .cfi_endproc
    .size   dlsym, .-dlsym

#endif

    .section .note.GNU-stack,"",%progbits
