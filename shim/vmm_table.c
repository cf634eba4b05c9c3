/*
 * vmm_table.c - the VMM path's table: imports keyed by export identity, and
 * reservations with their chunk mappings and access.
 *
 * Pure data structure: no CUDA, no I/O, no locking (the caller holds the one
 * lock). Whatever real driver work a decision needs (unmapping a kept chunk
 * that is in the way, freeing an evicted reservation, releasing an evicted
 * import) comes back as a list of operations for the caller to run, in
 * order, after dropping the lock.
 *
 * Imports: sorted by identity (a kept dup's open file description, ordered by
 * the caller's comparator, kcmp in production; or a fabric handle's bytes),
 * and by handle value; binary search on both. refs counts the app's imports
 * not yet released.
 *
 * Reservations: the address ranges the app reserved right after importing
 * (tracked), each with its chunks (mappings). A chunk is "adopted" while the
 * app has it mapped, "kept" after the app unmapped it while the real mapping
 * stays. A reservation the app freed while it still held kept chunks is
 * idle: the app sees nothing there, the driver sees it all.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define MAX_ACCESS 8 /* devices whose access a chunk remembers */

struct vimport {
    struct ipcc_vmm_id id;     /* id.fd: our kept dup */
    uint64_t handle;
    uint64_t refs;             /* the app's unreleased imports */
    uint64_t live_pins;        /* adopted chunks */
    uint64_t kept_pins;        /* kept chunks */
    uint64_t bytes;            /* known from the first map: 0 before */
    uint64_t last_ns;
    int counted;               /* in the idle gauges */
    uint64_t counted_bytes;
};

struct vaccess {
    int dev;
    unsigned long long flags;
};

struct vchunk {
    uint64_t addr, size;
    struct vimport *imp;       /* NULL: a handle not from our imports */
    int adopted;
    int naccess;               /* -1: more devices than we remember */
    struct vaccess access[MAX_ACCESS];
};

struct vres {
    uint64_t addr, size;
    int idle;
    uint64_t last_ns;
    struct vchunk *chunks;     /* sorted by address */
    size_t n, cap;
};

struct ipcc_vmm_table {
    ipcc_vmm_cmp_fn cmp;
    struct vimport **by_id, **by_handle;
    size_t nimports, capimports, caphandles;
    struct vres **res;
    size_t nres, capres;
    struct ipcc_vmm_gauges gauges;
};

/* ---- small helpers ------------------------------------------------------ */

static int grow(void **arr, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t n = *cap ? *cap * 2 : 16;
    while (n < need)
        n *= 2;
    void *p = realloc(*arr, n * elem);
    if (!p)
        return -1;
    *arr = p;
    *cap = n;
    return 0;
}

static void gauge_add(_Atomic uint64_t *g, int64_t n)
{
    atomic_store_explicit(g, atomic_load_explicit(g, memory_order_relaxed) + (uint64_t)n,
                          memory_order_relaxed);
}

/* An import is idle when the app holds no reference and no mapping of it:
 * what it pins then is ours alone. */
static void account(struct ipcc_vmm_table *t, struct vimport *m)
{
    int idle = m->refs == 0 && m->live_pins == 0;
    if (m->counted) {
        gauge_add(&t->gauges.idle_entries, -1);
        gauge_add(&t->gauges.idle_bytes, -(int64_t)m->counted_bytes);
    }
    if (idle) {
        gauge_add(&t->gauges.idle_entries, 1);
        gauge_add(&t->gauges.idle_bytes, (int64_t)m->bytes);
    }
    m->counted = idle;
    m->counted_bytes = m->bytes;
}

int ipcc_vmm_ops_push(struct ipcc_vmm_ops *o, enum ipcc_vmm_op op, uint64_t addr,
                      uint64_t size, uint64_t handle, int fd)
{
    if (grow((void **)&o->v, &o->cap, o->n + 1, sizeof(*o->v)) < 0) {
        o->lost++;
        return -1;
    }
    o->v[o->n++] = (struct ipcc_vmm_victim){ op, addr, size, handle, fd };
    return 0;
}

/* ---- create, clear ------------------------------------------------------ */

struct ipcc_vmm_table *ipcc_vmm_table_create(ipcc_vmm_cmp_fn cmp)
{
    struct ipcc_vmm_table *t = calloc(1, sizeof(*t));
    if (t)
        t->cmp = cmp;
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
        free(t->by_id[i]);
    }
    for (size_t i = 0; i < t->nres; i++) {
        free(t->res[i]->chunks);
        free(t->res[i]);
    }
    t->nimports = t->nres = 0;
    atomic_store(&t->gauges.idle_entries, 0);
    atomic_store(&t->gauges.idle_bytes, 0);
    atomic_store(&t->gauges.idle_reservations, 0);
}

void ipcc_vmm_table_destroy(struct ipcc_vmm_table *t, void (*close_fd)(int))
{
    if (!t)
        return;
    ipcc_vmm_table_clear(t, close_fd);
    free(t->by_id);
    free(t->by_handle);
    free(t->res);
    free(t);
}

const struct ipcc_vmm_gauges *ipcc_vmm_table_gauges(const struct ipcc_vmm_table *t)
{
    return &t->gauges;
}

size_t ipcc_vmm_table_imports(const struct ipcc_vmm_table *t)
{
    return t->nimports;
}

/* ---- imports: identity ---------------------------------------------------- */

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

static struct vimport *import_of(const struct ipcc_vmm_table *t, uint64_t handle)
{
    int found;
    long i = find_handle(t, handle, &found);
    return found ? t->by_handle[i] : NULL;
}

static void insert_at(struct vimport **arr, size_t n, size_t at, struct vimport *m)
{
    memmove(&arr[at + 1], &arr[at], (n - at) * sizeof(*arr));
    arr[at] = m;
}

static void remove_at(struct vimport **arr, size_t n, size_t at)
{
    memmove(&arr[at], &arr[at + 1], (n - at - 1) * sizeof(*arr));
}

/* ---- imports: the calls ---------------------------------------------------- */

/* 1: a cached import of id; a reference is taken and *handle set.
 * 0: not cached. -1: the comparator failed (identity cannot be decided). */
int ipcc_vmm_import_find(struct ipcc_vmm_table *t, const struct ipcc_vmm_id *id,
                         uint64_t now_ns, uint64_t *handle)
{
    int found;
    long i = find_id(t, id, &found);
    if (i < 0)
        return -1;
    if (!found)
        return 0;
    struct vimport *m = t->by_id[i];
    m->refs++;
    m->last_ns = now_ns;
    account(t, m);
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
    if (grow((void **)&t->by_id, &t->capimports, t->nimports + 1, sizeof(*t->by_id)) < 0 ||
        grow((void **)&t->by_handle, &t->caphandles, t->nimports + 1, sizeof(*t->by_handle)) < 0)
        return -1;
    struct vimport *m = calloc(1, sizeof(*m));
    if (!m)
        return -1;
    m->id = *id;
    m->handle = handle;
    m->refs = 1;
    m->last_ns = now_ns;
    insert_at(t->by_id, t->nimports, (size_t)i, m);
    insert_at(t->by_handle, t->nimports, (size_t)j, m);
    t->nimports++;
    return 1;
}

/* The app releases a handle. NOT_FOUND: not ours, the driver answers. */
enum ipcc_release_result ipcc_vmm_release(struct ipcc_vmm_table *t, uint64_t handle,
                                          uint64_t now_ns)
{
    struct vimport *m = import_of(t, handle);
    if (!m)
        return IPCC_RELEASE_NOT_FOUND;
    if (m->refs == 0)
        return IPCC_RELEASE_PAST_ZERO;
    m->refs--;
    m->last_ns = now_ns;
    account(t, m);
    return IPCC_RELEASE_OK;
}

/* Removes an import that nothing uses; the caller really releases it. */
static void drop_import(struct ipcc_vmm_table *t, struct vimport *m, struct ipcc_vmm_ops *ops)
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
    m->refs = 0;
    m->live_pins = 1; /* leaves the gauges */
    account(t, m);
    ipcc_vmm_ops_push(ops, IPCC_VMM_RELEASE, 0, 0, m->handle, m->id.fabric ? -1 : m->id.fd);
    free(m);
}

static int import_lone_idle(const struct vimport *m)
{
    return m->refs == 0 && m->live_pins == 0 && m->kept_pins == 0;
}

/* ---- reservations: finding ------------------------------------------------ */

static int overlaps(uint64_t a, uint64_t an, uint64_t b, uint64_t bn)
{
    return a < b + bn && b < a + an;
}

/* The tracked reservation containing addr; NULL if none. */
static struct vres *res_at(const struct ipcc_vmm_table *t, uint64_t addr, size_t *index)
{
    for (size_t i = 0; i < t->nres; i++) {
        struct vres *r = t->res[i];
        if (addr >= r->addr && addr < r->addr + r->size) {
            if (index)
                *index = i;
            return r;
        }
    }
    return NULL;
}

/* The live tracked reservation a call at addr is about; NULL with *v the
 * answer when there is none: PASS (not ours) or INVALID (the app freed it). */
static struct vres *live_res(const struct ipcc_vmm_table *t, uint64_t addr,
                             enum ipcc_vmm_verdict *v)
{
    struct vres *r = res_at(t, addr, NULL);
    *v = r ? IPCC_VMM_INVALID : IPCC_VMM_PASS;
    return r && !r->idle ? r : NULL;
}

static void set_idle(struct ipcc_vmm_table *t, struct vres *r, int idle)
{
    if (r->idle != idle)
        gauge_add(&t->gauges.idle_reservations, idle ? 1 : -1);
    r->idle = idle;
}

/* Starts tracking a reservation the app just made. -1: out of memory (the
 * reservation then simply goes uncached). */
int ipcc_vmm_reserve_track(struct ipcc_vmm_table *t, uint64_t addr, uint64_t size)
{
    if (grow((void **)&t->res, &t->capres, t->nres + 1, sizeof(*t->res)) < 0)
        return -1;
    struct vres *r = calloc(1, sizeof(*r));
    if (!r)
        return -1;
    r->addr = addr;
    r->size = size;
    t->res[t->nres++] = r;
    return 0;
}

static int in_list(uint64_t h, const uint64_t *list, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (list[i] == h)
            return 1;
    return 0;
}

/* Every kept chunk of r is one of the handles just imported. */
static int chunks_match(const struct vres *r, const uint64_t *handles, size_t n)
{
    if (r->n == 0)
        return 0;
    for (size_t i = 0; i < r->n; i++)
        if (!r->chunks[i].imp || !in_list(r->chunks[i].imp->handle, handles, n))
            return 0;
    return 1;
}

/* An idle reservation of exactly size (aligned to align) whose kept chunks
 * are all allocations in handles[]: handed back live, most recent first.
 * 1 and *addr set, or 0. */
int ipcc_vmm_reserve_reuse(struct ipcc_vmm_table *t, uint64_t size, uint64_t align,
                           const uint64_t *handles, size_t n, uint64_t now_ns, uint64_t *addr)
{
    struct vres *best = NULL;
    for (size_t i = 0; i < t->nres; i++) {
        struct vres *r = t->res[i];
        if (r->idle && r->size == size && (align == 0 || r->addr % align == 0) &&
            (!best || r->last_ns > best->last_ns) && chunks_match(r, handles, n))
            best = r;
    }
    if (!best)
        return 0;
    set_idle(t, best, 0);
    best->last_ns = now_ns;
    *addr = best->addr;
    return 1;
}

/* ---- chunks ---------------------------------------------------------------- */

static void chunk_pin(struct ipcc_vmm_table *t, struct vchunk *c, int adopted, int delta)
{
    if (!c->imp)
        return;
    if (adopted)
        c->imp->live_pins += (uint64_t)(int64_t)delta;
    else
        c->imp->kept_pins += (uint64_t)(int64_t)delta;
    account(t, c->imp);
}

static void chunk_adopt(struct ipcc_vmm_table *t, struct vchunk *c, int adopted)
{
    if (c->adopted == adopted)
        return;
    chunk_pin(t, c, c->adopted, -1);
    c->adopted = adopted;
    chunk_pin(t, c, c->adopted, +1);
}

static void chunk_remove(struct ipcc_vmm_table *t, struct vres *r, size_t i)
{
    chunk_pin(t, &r->chunks[i], r->chunks[i].adopted, -1);
    memmove(&r->chunks[i], &r->chunks[i + 1], (r->n - i - 1) * sizeof(*r->chunks));
    r->n--;
}

/* Kept chunks overlapping [addr, addr+size) give way: removed, and their
 * real unmaps queued, so that the driver sees what the app sees there. */
static void give_way(struct ipcc_vmm_table *t, struct vres *r, uint64_t addr, uint64_t size,
                     struct ipcc_vmm_ops *ops)
{
    for (size_t i = r->n; i-- > 0;) {
        struct vchunk *c = &r->chunks[i];
        if (!c->adopted && overlaps(addr, size, c->addr, c->size)) {
            ipcc_vmm_ops_push(ops, IPCC_VMM_UNMAP, c->addr, c->size, 0, -1);
            chunk_remove(t, r, i);
        }
    }
}

/* The chunks in [addr, addr+size) are whole, adopted when asked, and start
 * and end the range; with no_holes, they also cover it. */
static int whole_chunks(const struct vres *r, uint64_t addr, uint64_t size, int no_holes,
                        size_t *first, size_t *last)
{
    size_t n = 0;
    uint64_t expect = addr;
    for (size_t i = 0; i < r->n; i++) {
        const struct vchunk *c = &r->chunks[i];
        if (!overlaps(addr, size, c->addr, c->size))
            continue;
        if (c->addr < addr || c->addr + c->size > addr + size || !c->adopted || !c->imp)
            return 0;
        if ((no_holes && c->addr != expect) || (n == 0 && c->addr != addr))
            return 0;
        if (n++ == 0)
            *first = i;
        *last = i;
        expect = c->addr + c->size;
    }
    return n > 0 && expect == addr + size;
}

/* ---- map, unmap --------------------------------------------------------------- */

/*
 * The app maps handle at [addr, addr+size) (offset and flags 0). DONE_OK: the
 * same allocation is kept there, now the app's again. INVALID: the range is
 * one the app freed (an idle reservation): the driver would refuse it.
 * PASS: run ops, then the real map; on success call ipcc_vmm_map_done.
 */
enum ipcc_vmm_verdict ipcc_vmm_map(struct ipcc_vmm_table *t, uint64_t addr, uint64_t size,
                                   uint64_t handle, uint64_t now_ns, struct ipcc_vmm_ops *ops)
{
    enum ipcc_vmm_verdict v;
    struct vres *r = live_res(t, addr, &v);
    if (!r)
        return v;
    for (size_t i = 0; i < r->n; i++) {
        struct vchunk *c = &r->chunks[i];
        if (c->addr == addr && c->size == size && !c->adopted && c->imp &&
            c->imp->handle == handle) {
            chunk_adopt(t, c, 1);
            c->imp->last_ns = now_ns;
            r->last_ns = now_ns;
            return IPCC_VMM_DONE;
        }
    }
    give_way(t, r, addr, size, ops);
    return IPCC_VMM_PASS;
}

/* Records the app's successful real map. */
void ipcc_vmm_map_done(struct ipcc_vmm_table *t, uint64_t addr, uint64_t size, uint64_t handle)
{
    struct vres *r = res_at(t, addr, NULL);
    if (!r || grow((void **)&r->chunks, &r->cap, r->n + 1, sizeof(*r->chunks)) < 0)
        return; /* untracked or no memory: a chunk we do not know is never kept */
    size_t at = 0;
    while (at < r->n && r->chunks[at].addr < addr)
        at++;
    memmove(&r->chunks[at + 1], &r->chunks[at], (r->n - at) * sizeof(*r->chunks));
    r->n++;
    struct vchunk *c = &r->chunks[at];
    memset(c, 0, sizeof(*c));
    c->addr = addr;
    c->size = size;
    c->imp = import_of(t, handle);
    c->adopted = 1;
    if (c->imp)
        c->imp->bytes = size; /* a map covers exactly its allocation */
    chunk_pin(t, c, 1, +1);
}

/*
 * The app unmaps [addr, addr+size). DONE_OK: it is exactly whole mappings of
 * our imports (holes allowed), which are kept. INVALID: a freed range.
 * PASS: run ops, then the real unmap; on success ipcc_vmm_unmap_done.
 */
enum ipcc_vmm_verdict ipcc_vmm_unmap(struct ipcc_vmm_table *t, uint64_t addr, uint64_t size,
                                     uint64_t now_ns, struct ipcc_vmm_ops *ops)
{
    enum ipcc_vmm_verdict v;
    struct vres *r = live_res(t, addr, &v);
    if (!r)
        return v;
    size_t first, last;
    if (size && addr + size <= r->addr + r->size && whole_chunks(r, addr, size, 0, &first, &last)) {
        for (size_t i = first; i <= last; i++)
            if (r->chunks[i].adopted)
                chunk_adopt(t, &r->chunks[i], 0);
        r->last_ns = now_ns;
        return IPCC_VMM_DONE;
    }
    give_way(t, r, addr, size, ops);
    return IPCC_VMM_PASS;
}

/* The real unmap succeeded: the mappings inside the range are gone. */
void ipcc_vmm_unmap_done(struct ipcc_vmm_table *t, uint64_t addr, uint64_t size)
{
    struct vres *r = res_at(t, addr, NULL);
    for (size_t i = r ? r->n : 0; i-- > 0;) {
        struct vchunk *c = &r->chunks[i];
        if (c->addr >= addr && c->addr + c->size <= addr + size)
            chunk_remove(t, r, i);
    }
}

/* ---- access ------------------------------------------------------------------- */

static int chunk_has(const struct vchunk *c, const struct ipcc_vmm_access *a)
{
    for (int i = 0; i < c->naccess; i++)
        if (c->access[i].dev == a->dev)
            return c->access[i].flags == a->flags;
    return 0;
}

/*
 * The app sets access on [addr, addr+size) for n devices. DONE_OK: the range
 * is exactly whole adopted chunks, with no holes, each already with exactly
 * this access: the driver would change nothing. INVALID: a freed range.
 * PASS: run ops, then the real call; on success ipcc_vmm_set_access_done.
 */
enum ipcc_vmm_verdict ipcc_vmm_set_access(struct ipcc_vmm_table *t, uint64_t addr, uint64_t size,
                                          const struct ipcc_vmm_access *acc, size_t n,
                                          struct ipcc_vmm_ops *ops)
{
    enum ipcc_vmm_verdict v;
    struct vres *r = live_res(t, addr, &v);
    if (!r)
        return v;
    size_t first, last;
    if (n > 0 && size && whole_chunks(r, addr, size, 1, &first, &last)) {
        int same = 1;
        for (size_t i = first; i <= last && same; i++)
            for (size_t k = 0; k < n && same; k++)
                same = chunk_has(&r->chunks[i], &acc[k]);
        if (same)
            return IPCC_VMM_DONE;
    }
    give_way(t, r, addr, size, ops);
    return IPCC_VMM_PASS;
}

static void chunk_set(struct vchunk *c, const struct ipcc_vmm_access *a)
{
    if (c->naccess < 0)
        return;
    for (int i = 0; i < c->naccess; i++) {
        if (c->access[i].dev == a->dev) {
            c->access[i].flags = a->flags;
            return;
        }
    }
    if (c->naccess == MAX_ACCESS) {
        c->naccess = -1; /* forget: never skip on this chunk again */
        return;
    }
    c->access[c->naccess++] = (struct vaccess){ a->dev, a->flags };
}

/* The real set-access succeeded: remember it, in the driver's order. */
void ipcc_vmm_set_access_done(struct ipcc_vmm_table *t, uint64_t addr, uint64_t size,
                              const struct ipcc_vmm_access *acc, size_t n)
{
    struct vres *r = res_at(t, addr, NULL);
    for (size_t i = 0; r && i < r->n; i++) {
        struct vchunk *c = &r->chunks[i];
        if (c->addr >= addr && c->addr + c->size <= addr + size)
            for (size_t k = 0; k < n; k++)
                chunk_set(c, &acc[k]);
    }
}

/* A call the table does not answer (get-access, a map with an offset...):
 * kept chunks in [addr, addr+size) give way first, since the app sees
 * nothing mapped there. INVALID: a freed range. */
enum ipcc_vmm_verdict ipcc_vmm_give_way(struct ipcc_vmm_table *t, uint64_t addr, uint64_t size,
                                        struct ipcc_vmm_ops *ops)
{
    enum ipcc_vmm_verdict v;
    struct vres *r = live_res(t, addr, &v);
    if (!r)
        return v;
    give_way(t, r, addr, size ? size : 1, ops);
    return IPCC_VMM_PASS;
}

/* ---- address free, eviction ----------------------------------------------------- */

static void res_remove(struct ipcc_vmm_table *t, size_t index)
{
    struct vres *r = t->res[index];
    set_idle(t, r, 0);
    free(r->chunks);
    free(r);
    t->res[index] = t->res[--t->nres];
}

/* Queues the real teardown of reservation index: its kept chunks, the range,
 * and (release_imports) the imports left with no use at all. */
static void res_evict(struct ipcc_vmm_table *t, size_t index, int release_imports,
                      struct ipcc_vmm_ops *ops)
{
    struct vres *r = t->res[index];
    while (r->n > 0) {
        struct vchunk c = r->chunks[r->n - 1];
        ipcc_vmm_ops_push(ops, IPCC_VMM_UNMAP, c.addr, c.size, 0, -1);
        chunk_remove(t, r, r->n - 1);
        if (release_imports && c.imp && import_lone_idle(c.imp))
            drop_import(t, c.imp, ops);
    }
    ipcc_vmm_ops_push(ops, IPCC_VMM_FREE, r->addr, r->size, 0, -1);
    res_remove(t, index);
}

/*
 * The app frees [addr, addr+size). DONE_OK: exactly a tracked reservation
 * with no mapping the app still sees, but kept chunks: it becomes idle.
 * INVALID: freed already. PASS: the driver answers; on success
 * ipcc_vmm_free_done.
 */
enum ipcc_vmm_verdict ipcc_vmm_free(struct ipcc_vmm_table *t, uint64_t addr, uint64_t size,
                                    uint64_t now_ns, struct ipcc_vmm_ops *ops)
{
    (void)ops; /* the shape of every range call; a free never needs one */
    enum ipcc_vmm_verdict v;
    struct vres *r = live_res(t, addr, &v);
    if (!r)
        return v;
    if (r->addr != addr || r->size != size || r->n == 0)
        return IPCC_VMM_PASS;
    for (size_t i = 0; i < r->n; i++)
        if (r->chunks[i].adopted)
            return IPCC_VMM_PASS;
    set_idle(t, r, 1);
    r->last_ns = now_ns;
    return IPCC_VMM_DONE;
}

void ipcc_vmm_free_done(struct ipcc_vmm_table *t, uint64_t addr, uint64_t size)
{
    size_t i;
    struct vres *r = res_at(t, addr, &i);
    if (r && r->addr == addr && r->size == size)
        res_remove(t, i);
}

/* Idle reservations overlapping [addr, addr+size) (an address hint the
 * driver should be free to honour) are torn down; imports stay cached. */
void ipcc_vmm_clear_range(struct ipcc_vmm_table *t, uint64_t addr, uint64_t size,
                          struct ipcc_vmm_ops *ops)
{
    for (size_t i = t->nres; i-- > 0;)
        if (t->res[i]->idle && overlaps(addr, size, t->res[i]->addr, t->res[i]->size))
            res_evict(t, i, 0, ops);
}

/*
 * Queues the teardown of the least recently used idle thing: an idle
 * reservation (with the imports only it used), or an import nothing uses.
 * Returns 0 when nothing is idle.
 */
int ipcc_vmm_evict_one(struct ipcc_vmm_table *t, struct ipcc_vmm_ops *ops)
{
    long best_res = -1, best_imp = -1;
    uint64_t best_ns = UINT64_MAX;
    for (size_t i = 0; i < t->nres; i++) {
        if (t->res[i]->idle && t->res[i]->last_ns <= best_ns) {
            best_ns = t->res[i]->last_ns;
            best_res = (long)i;
        }
    }
    for (size_t i = 0; i < t->nimports; i++) {
        struct vimport *m = t->by_id[i];
        if (import_lone_idle(m) && m->last_ns < best_ns) {
            best_ns = m->last_ns;
            best_imp = (long)i;
        }
    }
    if (best_imp >= 0)
        drop_import(t, t->by_id[best_imp], ops);
    else if (best_res >= 0)
        res_evict(t, (size_t)best_res, 1, ops);
    else
        return 0;
    return 1;
}

int ipcc_vmm_over_caps(const struct ipcc_vmm_table *t, uint64_t max_bytes, uint64_t max_entries)
{
    uint64_t bytes = atomic_load_explicit(&t->gauges.idle_bytes, memory_order_relaxed);
    uint64_t entries = atomic_load_explicit(&t->gauges.idle_entries, memory_order_relaxed);
    return bytes > max_bytes || entries > max_entries;
}
