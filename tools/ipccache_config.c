/*
 * ipccache_config.c - ipccache-config: the library's own settings parser
 * (shim/base/config.c) as a command, so that the tools and the README use the
 * same names, defaults and grammar as the library instead of a copy.
 *
 *   ipccache-config --check              check the IPCCACHE_* environment
 *   ipccache-config --check-value NAME VALUE
 *   ipccache-config --list | --markdown  the settings table
 *   ipccache-config --help | --version
 *
 * --check runs the library's own checks (the values, the names, whether the
 * stats file can be written): each problem is an error that says what the
 * library would do instead, and the status is 1 (a start check fails on
 * it); with IPCCACHE_STRICT on, the library's error and exit status 78; with
 * none, one line on stdout says so. --check-value exits 1 and says what was
 * expected on a bad value, 2 on an unknown name.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base.h"
#include "base_impl.h"

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
          "       ipccache-config --help | --version\n"
          "Checks IPCCACHE_* settings with the library's own parser, or prints them.\n"
          "--check: an error for each bad value, unknown name or stats file that cannot be\n"
          "written, then exit status 1 (78 with IPCCACHE_STRICT on, as the library); 0 and\n"
          "one line when all are good.\n",
          to);
    return status;
}

static int usage_error(const char *fmt, const char *what)
{
    fputs("ipccache-config: ", stderr);
    fprintf(stderr, fmt, what);
    fputs("\n", stderr);
    return usage(stderr, EX_USAGE_STATUS);
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
    char expected[256];
    ipcc_config_expected(st, value, expected, sizeof(expected));
    fprintf(stderr, "ipccache-config: %s=\"%s\" is invalid: %s\n", name, value, expected);
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

static int check(void)
{
    ipcc_config_check(); /* exits 78 itself when strict */
    if (problems)
        return EX_BAD_SETTING;
    puts("ipccache-config: every IPCCACHE_* setting is good");
    return 0;
}

/* Each option with the number of arguments it takes. */
static const struct {
    const char *name;
    int args;
} options[] = {
    { "--check", 0 }, { "--check-value", 2 }, { "--list", 0 },
    { "--markdown", 0 }, { "--help", 0 },     { "--version", 0 },
};

int main(int argc, char **argv)
{
    if (argc < 2)
        return usage(stderr, EX_USAGE_STATUS);
    const char *opt = argv[1];
    int known = -1;
    for (size_t i = 0; i < sizeof(options) / sizeof(options[0]); i++)
        if (strcmp(opt, options[i].name) == 0)
            known = options[i].args;
    if (known < 0)
        return usage_error("unknown option '%s'", opt);
    if (argc - 2 != known)
        return usage_error(known ? "%s takes two arguments, NAME and VALUE" : "%s takes no argument",
                           opt);
    if (strcmp(opt, "--check") == 0)
        return check();
    if (strcmp(opt, "--check-value") == 0)
        return check_value(argv[2], argv[3]);
    if (strcmp(opt, "--help") == 0)
        return usage(stdout, 0);
    if (strcmp(opt, "--version") == 0)
        return puts("ipccache-config " IPCC_VERSION) < 0;
    return list(opt[2] == 'm');
}
