/*
 * ipccache_config.c - ipccache-config: the library's own settings parser
 * (shim/base/config.c) as a command, so that the tools and the README use the
 * same names, defaults and grammar as the library instead of a copy.
 *
 *   ipccache-config --check              check the IPCCACHE_* environment
 *   ipccache-config --check-value NAME VALUE
 *   ipccache-config --list | --markdown  the settings table
 *
 * --check reports exactly what the library would at its first IPC call: a
 * warning per bad value or unknown name, and then exits 1 (a start check
 * fails on it), or with IPCCACHE_STRICT on the library's error and exit
 * status 78. --check-value exits 1 and says what was expected on a bad
 * value, 2 on an unknown name.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base.h"

#define EX_USAGE_STATUS 2
#define EX_BAD_SETTING 1

/* The library's messages pass through here (linked with
 * --wrap=ipcc_log): each warning or error of the settings' load is one
 * problem, counted whether or not IPCCACHE_LOG shows it. */
void __real_ipcc_log(enum ipcc_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void __wrap_ipcc_log(enum ipcc_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static unsigned problems;

void __wrap_ipcc_log(enum ipcc_log_level level, const char *fmt, ...)
{
    char text[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    problems += level <= IPCC_LOG_WARN;
    __real_ipcc_log(level, "%s", text);
}

static int usage(FILE *to, int status)
{
    fputs("Usage: ipccache-config --check\n"
          "       ipccache-config --check-value NAME VALUE\n"
          "       ipccache-config --list | --markdown\n"
          "Checks IPCCACHE_* settings with the library's own parser, or prints them.\n"
          "--check: the library's message for each bad value or unknown name, then exit\n"
          "status 1 (78 with IPCCACHE_STRICT on, as the library); 0 when all are good.\n",
          to);
    return status;
}

static const struct ipcc_setting *find_setting(const char *name)
{
    size_t n;
    const struct ipcc_setting *table = ipcc_config_table(&n);
    for (size_t i = 0; i < n; i++)
        if (strcmp(table[i].name, name) == 0)
            return &table[i];
    return NULL;
}

static int check_value(const char *name, const char *value)
{
    const struct ipcc_setting *st = find_setting(name);
    if (!st) {
        fprintf(stderr, "ipccache-config: unknown setting %s\n", name);
        return EX_USAGE_STATUS;
    }
    if (st->set(value) == 0)
        return 0;
    fprintf(stderr, "ipccache-config: %s=\"%s\" is invalid: expected %s\n", name, value,
            st->expect);
    return 1;
}

/* Tab-separated for scripts, or the Markdown table of the README. */
static int list(int markdown)
{
    size_t n;
    const struct ipcc_setting *table = ipcc_config_table(&n);
    if (markdown)
        puts("| Variable | Default | Meaning |\n| --- | --- | --- |");
    for (size_t i = 0; i < n; i++) {
        const struct ipcc_setting *st = &table[i];
        if (!markdown)
            printf("%s\t%s\t%s\n", st->name, st->default_text[0] ? st->default_text : "unset",
                   st->meaning);
        else if (st->default_text[0])
            printf("| `%s` | `%s` | %s |\n", st->name, st->default_text, st->meaning);
        else
            printf("| `%s` | unset | %s |\n", st->name, st->meaning);
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "--check") == 0) {
        ipcc_config_load(); /* exits 78 itself when strict */
        return problems ? EX_BAD_SETTING : 0;
    }
    if (argc == 4 && strcmp(argv[1], "--check-value") == 0)
        return check_value(argv[2], argv[3]);
    if (argc == 2 && (strcmp(argv[1], "--list") == 0 || strcmp(argv[1], "--markdown") == 0))
        return list(argv[1][2] == 'm');
    if (argc == 2 && strcmp(argv[1], "--help") == 0)
        return usage(stdout, 0);
    return usage(stderr, EX_USAGE_STATUS);
}
