/*
 * hello_sanitized.c - a program built with ThreadSanitizer. Sanitizer
 * runtimes call dlsym while they initialise, before anything else runs; a
 * preloaded dlsym must survive that and stay out of the way.
 */
#include <stdio.h>

int main(void)
{
    puts("hello");
    return 0;
}
