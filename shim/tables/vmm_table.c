/*
 * vmm_table.c - the VMM path's table, and its imports keyed by export
 * identity.
 *
 * Pure data structure: no CUDA, no I/O, no locking (the caller holds the one
 * lock). Whatever real driver work a decision needs (unmapping a kept chunk
 * that is in the way, freeing an evicted reservation, releasing an evicted
 * import) comes back as a list of operations for the caller to run, in
 * order, after dropping the lock.
 *
 * Imports are sorted by identity (a kept dup's open file description, ordered
 * by the caller's comparator, kcmp in production; or a fabric handle's bytes)
 * and by handle value; binary search on both, after one comparison with the
 * import that followed the last one found the time before. refs counts the app's imports
 * not yet released. Reservations and their chunks: vmm_ranges.c.
 */
#include <stdlib.h>
#include <string.h>

#include "vmm_table_impl.h"

/* ---- small helpers ------------------------------------------------------ */

int ipcc_vmm_grow(void **arr, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t n = *cap ? *cap * 2 : 16;
    while (n < need)
        n *= 2;
    void *p = ipcc_mem_realloc(*arr, n * elem);
    if (!p)
        return -1;
    *arr = p;
    *cap = n;
    return 0;
}

void ipcc_vmm_gauge_add(_Atomic uint64_t *g, int64_t n)
{
    atomic_store_explicit(g, atomic_load_explicit(g, memory_order_relaxed) + (uint64_t)n,
                          memory_order_relaxed);
}

/* An import is idle when the app holds no reference and no mapping of it:
 * what it pins then is ours alone. */
void ipcc_vmm_account(struct ipcc_vmm_table *t, struct ipcc_vmm_import *m)
{
    int idle = m->refs == 0 && m->live_pins == 0;
    if (m->counted) {
        ipcc_vmm_gauge_add(&t->gauges.idle_entries, -1);
        ipcc_vmm_gauge_add(&t->gauges.idle_bytes, -(int64_t)m->counted_bytes);
    }
    if (idle) {
        ipcc_vmm_gauge_add(&t->gauges.idle_entries, 1);
        ipcc_vmm_gauge_add(&t->gauges.idle_bytes, (int64_t)m->bytes);
    }
    m->counted = idle;
    m->counted_bytes = m->bytes;
}

int ipcc_vmm_ops_push(struct ipcc_vmm_ops *o, enum ipcc_vmm_op op, uint64_t addr,
                      uint64_t size, uint64_t handle, int fd)
{
    if (ipcc_vmm_grow((void **)&o->v, &o->cap, o->n + 1, sizeof(*o->v)) < 0) {
        o->lost++;
        return -1;
    }
    o->v[o->n++] = (struct ipcc_vmm_victim){ op, addr, size, handle, fd };
    return 0;
}

/* ---- create, clear ------------------------------------------------------ */

/* same may be NULL: the comparator then checks guesses too. */
struct ipcc_vmm_table *ipcc_vmm_table_create(ipcc_vmm_cmp_fn cmp, ipcc_vmm_same_fn same)
{
    struct ipcc_vmm_table *t = ipcc_mem_calloc(1, sizeof(*t));
    if (t) {
        t->cmp = cmp;
        t->same = same;
    }
    return t;
}

/* Forgets everything; close_fd (if given) gets each kept dup. For a fork
 * child, whose driver state is unusable: no real release is asked for. */
void ipcc_vmm_table_clear(struct ipcc_vmm_table *t, void (*close_fd)(int))
{
    if (!t)
        return;
    for (size_t i = 0; i < t->nimports; i++) {
        if (close_fd && !t->by_id[i]->id.fabric)
            close_fd(t->by_id[i]->id.fd);
        ipcc_mem_free(t->by_id[i]);
    }
    for (size_t i = 0; i < t->nres; i++) {
        ipcc_mem_free(t->res[i]->chunks);
        ipcc_mem_free(t->res[i]);
    }
    t->nimports = t->nres = t->nreleasing = 0;
    t->last_found = NULL;
    ipcc_vmm_predict_clear(&t->predict);
    atomic_store(&t->gauges.idle_entries, 0);
    atomic_store(&t->gauges.idle_bytes, 0);
    atomic_store(&t->gauges.idle_reservations, 0);
    atomic_store(&t->gauges.kept_fds, 0);
}

void ipcc_vmm_table_destroy(struct ipcc_vmm_table *t, void (*close_fd)(int))
{
    if (!t)
        return;
    ipcc_vmm_table_clear(t, close_fd);
    ipcc_mem_free(t->by_id);
    ipcc_mem_free(t->by_handle);
    ipcc_mem_free(t->res);
    ipcc_mem_free(t->releasing);
    ipcc_mem_free(t);
}

const struct ipcc_vmm_gauges *ipcc_vmm_table_gauges(const struct ipcc_vmm_table *t)
{
    return &t->gauges;
}

size_t ipcc_vmm_table_imports(const struct ipcc_vmm_table *t)
{
    return t->nimports;
}

/* ---- kept dups: how many (vmm_fds.c bounds them) ----------------------------- */

/* A place for one more kept dup, while fewer than bound are kept: 1, or 0.
 * The place is the import's once recorded (its drop gives it back), else
 * the caller's to give back. */
int ipcc_vmm_fd_claim(struct ipcc_vmm_table *t, size_t bound)
{
    if (ipcc_vmm_table_fds(t) >= bound)
        return 0;
    ipcc_vmm_gauge_add(&t->gauges.kept_fds, 1);
    return 1;
}

void ipcc_vmm_fd_unclaim(struct ipcc_vmm_table *t)
{
    ipcc_vmm_gauge_add(&t->gauges.kept_fds, -1);
}

size_t ipcc_vmm_table_fds(const struct ipcc_vmm_table *t)
{
    return (size_t)atomic_load_explicit(&t->gauges.kept_fds, memory_order_relaxed);
}

/* ---- imports: identity ---------------------------------------------------- */

/* An asked fd with a kept dup's number: we hold that number open, so
 * someone closed our dup (a stray close, close_range) and the number now
 * names whatever came next. Comparing it with itself would say "same". */
static int one_number(const struct ipcc_vmm_id *a, const struct ipcc_vmm_id *b)
{
    return !a->fabric && !b->fabric && a->fd == b->fd;
}

/* Three-way order of identities: fd ones first, then fabric by bytes.
 * Returns IPCC_VMM_CMP_FAILED or IPCC_VMM_UNORDERED as the comparator does. */
static int id_order(const struct ipcc_vmm_table *t, const struct ipcc_vmm_id *a,
                    const struct ipcc_vmm_id *b)
{
    if (a->fabric != b->fabric)
        return a->fabric ? 1 : -1;
    if (a->fabric) {
        int c = memcmp(a->bytes, b->bytes, sizeof(a->bytes));
        return c < 0 ? -1 : c > 0;
    }
    if (one_number(a, b))
        return IPCC_VMM_CMP_FAILED; /* undecidable: passed through, uncached */
    return t->cmp(a->fd, b->fd);
}

/* Index in by_id of id, or where it would go (*found = 0). -1 when the
 * comparator failed. Falls back to a scan if it cannot order two files. */
static long find_id(const struct ipcc_vmm_table *t, const struct ipcc_vmm_id *id, int *found)
{
    size_t lo = 0, hi = t->nimports;
    *found = 0;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = id_order(t, id, &t->by_id[mid]->id);
        if (c == IPCC_VMM_CMP_FAILED)
            return -1;
        if (c == IPCC_VMM_UNORDERED)
            goto scan;
        if (c == 0) {
            *found = 1;
            return (long)mid;
        }
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return (long)lo;
scan:
    for (size_t i = 0; i < t->nimports; i++) {
        int c = id_order(t, id, &t->by_id[i]->id);
        if (c == IPCC_VMM_CMP_FAILED)
            return -1;
        if (c == 0) {
            *found = 1;
            return (long)i;
        }
    }
    return (long)t->nimports; /* unordered: appended; order is moot */
}

static long find_handle(const struct ipcc_vmm_table *t, uint64_t handle, int *found)
{
    size_t lo = 0, hi = t->nimports;
    *found = 0;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        uint64_t h = t->by_handle[mid]->handle;
        if (h == handle) {
            *found = 1;
            return (long)mid;
        }
        if (handle < h)
            hi = mid;
        else
            lo = mid + 1;
    }
    return (long)lo;
}

struct ipcc_vmm_import *ipcc_vmm_import_of(const struct ipcc_vmm_table *t, uint64_t handle)
{
    int found;
    long i = find_handle(t, handle, &found);
    return found ? t->by_handle[i] : NULL;
}

static void insert_at(struct ipcc_vmm_import **arr, size_t n, size_t at,
                      struct ipcc_vmm_import *m)
{
    memmove(&arr[at + 1], &arr[at], (n - at) * sizeof(*arr));
    arr[at] = m;
}

static void remove_at(struct ipcc_vmm_import **arr, size_t n, size_t at)
{
    memmove(&arr[at], &arr[at + 1], (n - at - 1) * sizeof(*arr));
}

/* ---- prediction --------------------------------------------------------- */

/* Whether id is m's identity: one equality test (fcntl), where the kernel
 * has one, else the ordering comparator (kcmp, dearer). */
static int is_import(const struct ipcc_vmm_table *t, const struct ipcc_vmm_id *id,
                     const struct ipcc_vmm_import *m)
{
    if (one_number(id, &m->id))
        return 0;
    if (t->same && !id->fabric && !m->id.fabric) {
        int same = t->same(id->fd, m->id.fd);
        if (same >= 0)
            return same;
    }
    return id_order(t, id, &m->id) == 0;
}

/* A rebuild imports a segment's chunks in the same order every time, and a
 * weight sync its tensors' segments: the import found after m last time is
 * most likely the one asked for after m now. Two neighbouring tensors share
 * a chunk, and so import it twice in a row: m itself is the second guess.
 * One comparison confirms a guess (the identity stays exact); wrong guesses
 * cost one comparison each before the search. */
static struct ipcc_vmm_import *predicted(const struct ipcc_vmm_table *t,
                                         const struct ipcc_vmm_id *id)
{
    struct ipcc_vmm_import *last = t->last_found;
    if (!last)
        return NULL;
    if (last->next_found && is_import(t, id, last->next_found))
        return last->next_found;
    return last != last->next_found && is_import(t, id, last) ? last : NULL;
}

static void note_found(struct ipcc_vmm_table *t, struct ipcc_vmm_import *m)
{
    if (t->last_found && t->last_found != m)
        t->last_found->next_found = m;
    t->last_found = m;
}

/* m is going: nothing may predict it any more. */
static void unpredict(struct ipcc_vmm_table *t, const struct ipcc_vmm_import *m)
{
    if (t->last_found == m)
        t->last_found = NULL;
    for (size_t k = 0; k < t->nimports; k++)
        if (t->by_id[k]->next_found == m)
            t->by_id[k]->next_found = NULL;
}

/* ---- imports: the calls ---------------------------------------------------- */

/* 1: a cached import of id; a reference is taken and *handle set.
 * 0: not cached. -1: the comparator failed (identity cannot be decided). */
int ipcc_vmm_import_find(struct ipcc_vmm_table *t, const struct ipcc_vmm_id *id,
                         uint64_t now_ns, uint64_t *handle)
{
    struct ipcc_vmm_import *m = predicted(t, id);
    if (!m) {
        int found;
        long i = find_id(t, id, &found);
        if (i < 0)
            return -1;
        if (!found)
            return 0;
        m = t->by_id[i];
    }
    note_found(t, m);
    m->refs++;
    m->last_ns = now_ns;
    ipcc_vmm_account(t, m);
    *handle = m->handle;
    return 1;
}

/*
 * Records a real import of id (whose fd the table now owns) with one
 * reference. If another thread recorded the same identity meanwhile, takes a
 * reference on that one instead and returns 0 with *cached set: the caller
 * then really releases its handle and closes its dup. -1: not recorded (out
 * of memory, or the comparator failed); the caller keeps both.
 */
int ipcc_vmm_import_insert(struct ipcc_vmm_table *t, const struct ipcc_vmm_id *id,
                           uint64_t handle, uint64_t now_ns, uint64_t *cached)
{
    int found;
    long i = find_id(t, id, &found);
    if (i < 0)
        return -1;
    if (found)
        return ipcc_vmm_import_find(t, id, now_ns, cached) == 1 ? 0 : -1;
    long j = find_handle(t, handle, &found);
    if (found)
        return -1; /* the driver reused a handle we still hold: cannot be */
    if (ipcc_vmm_grow((void **)&t->by_id, &t->capimports, t->nimports + 1, sizeof(*t->by_id)) < 0 ||
        ipcc_vmm_grow((void **)&t->by_handle, &t->caphandles, t->nimports + 1,
                      sizeof(*t->by_handle)) < 0)
        return -1;
    struct ipcc_vmm_import *m = ipcc_mem_calloc(1, sizeof(*m));
    if (!m)
        return -1;
    m->id = *id;
    m->handle = handle;
    m->refs = 1;
    m->last_ns = now_ns;
    insert_at(t->by_id, t->nimports, (size_t)i, m);
    insert_at(t->by_handle, t->nimports, (size_t)j, m);
    t->nimports++;
    note_found(t, m);
    return 1;
}

/* ---- imports: dropped, until really released ------------------------------------ */

/* Between a drop (under the lock) and the real release (after it) the driver
 * still knows the handle; a release or map of it by the app meanwhile must
 * get the answer to a released handle, not reach the driver. A handle the
 * table cannot note (out of memory) is not guarded: as before. */
static long releasing_at(const struct ipcc_vmm_table *t, uint64_t handle)
{
    for (size_t i = 0; i < t->nreleasing; i++)
        if (t->releasing[i] == handle)
            return (long)i;
    return -1;
}

static void note_releasing(struct ipcc_vmm_table *t, uint64_t handle)
{
    if (ipcc_vmm_grow((void **)&t->releasing, &t->capreleasing, t->nreleasing + 1,
                      sizeof(*t->releasing)) == 0)
        t->releasing[t->nreleasing++] = handle;
}

/* The app releases a handle. NOT_FOUND: not ours, the driver answers. */
enum ipcc_release_result ipcc_vmm_release(struct ipcc_vmm_table *t, uint64_t handle,
                                          uint64_t now_ns)
{
    struct ipcc_vmm_import *m = ipcc_vmm_import_of(t, handle);
    if (!m)
        return releasing_at(t, handle) >= 0 ? IPCC_RELEASE_PAST_ZERO : IPCC_RELEASE_NOT_FOUND;
    if (m->refs == 0)
        return IPCC_RELEASE_PAST_ZERO;
    m->refs--;
    m->last_ns = now_ns;
    ipcc_vmm_account(t, m);
    return IPCC_RELEASE_OK;
}

/* 1 when handle is an import of ours the app released as often as it
 * imported it (kept, or dropped and not yet really released): to the app, a
 * handle the driver took back. */
int ipcc_vmm_import_released(const struct ipcc_vmm_table *t, uint64_t handle)
{
    const struct ipcc_vmm_import *m = ipcc_vmm_import_of(t, handle);
    return m ? m->refs == 0 : releasing_at(t, handle) >= 0;
}

/* The real release of a dropped import's handle is done (whatever its
 * answer): from now on the driver answers for that value. Lock held. */
void ipcc_vmm_release_done(struct ipcc_vmm_table *t, uint64_t handle)
{
    long i = releasing_at(t, handle);
    if (i >= 0)
        t->releasing[i] = t->releasing[--t->nreleasing];
}

/* Removes an import that nothing uses; the caller really releases it. */
void ipcc_vmm_drop_import(struct ipcc_vmm_table *t, struct ipcc_vmm_import *m,
                          struct ipcc_vmm_ops *ops)
{
    int found;
    long i = find_handle(t, m->handle, &found);
    remove_at(t->by_handle, t->nimports, (size_t)i);
    for (size_t k = 0; k < t->nimports; k++) {
        if (t->by_id[k] == m) {
            remove_at(t->by_id, t->nimports, k);
            break;
        }
    }
    t->nimports--;
    unpredict(t, m);
    m->refs = 0;
    m->live_pins = 1; /* leaves the gauges */
    ipcc_vmm_account(t, m);
    ipcc_vmm_ops_push(ops, IPCC_VMM_RELEASE, 0, 0, m->handle, m->id.fabric ? -1 : m->id.fd);
    if (!m->id.fabric)
        ipcc_vmm_fd_unclaim(t); /* closed right after the lock */
    note_releasing(t, m->handle);
    ipcc_mem_free(m);
}

int ipcc_vmm_import_lone_idle(const struct ipcc_vmm_import *m)
{
    return m->refs == 0 && m->live_pins == 0 && m->kept_pins == 0;
}

/* Notes which export (ledger tag) the import with this handle came from, so
 * that its exporter's release can reach it. 1, or 0 if it is not ours. */
int ipcc_vmm_import_tag(struct ipcc_vmm_table *t, uint64_t handle, const void *tag)
{
    struct ipcc_vmm_import *m = ipcc_vmm_import_of(t, handle);
    if (!m)
        return 0;
    memcpy(m->tag, tag, IPCC_HANDLE_BYTES);
    m->tagged = 1;
    return 1;
}
