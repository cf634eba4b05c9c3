/*
 * dlsym_x86_64.S - the exported dlsym.
 *
 * glibc decides what RTLD_NEXT means from the return address of whoever
 * called dlsym. A C wrapper that calls the real dlsym would make every
 * RTLD_NEXT lookup in the process relative to this library. So: ask
 * ipcc_dlsym_hook(handle, name, caller's return address) whether the name
 * is one we wrap; if it returns a pointer, return that; otherwise restore
 * the arguments and the stack exactly as the caller left them and jump to
 * the real dlsym.
 * Written in assembly because C cannot promise a tail jump.
 */
#if defined(__x86_64__)

    .text
    .globl  dlsym
    .type   dlsym, @function
    .p2align 4
dlsym:
    .cfi_startproc
#if defined(__CET__)
    endbr64
#endif
    movq    (%rsp), %rdx             /* who is asking */
    pushq   %rdi
    .cfi_adjust_cfa_offset 8
    pushq   %rsi
    .cfi_adjust_cfa_offset 8
    subq    $8, %rsp                 /* 16-byte alignment at the call */
    .cfi_adjust_cfa_offset 8
    call    ipcc_dlsym_hook
    addq    $8, %rsp
    .cfi_adjust_cfa_offset -8
    popq    %rsi
    .cfi_adjust_cfa_offset -8
    popq    %rdi
    .cfi_adjust_cfa_offset -8
    testq   %rax, %rax
    jnz     1f
    jmp     *ipcc_real_dlsym(%rip)   /* set by ipcc_dlsym_hook */
1:
    ret
    .cfi_endproc
    .size   dlsym, .-dlsym

#endif

    .section .note.GNU-stack,"",@progbits
