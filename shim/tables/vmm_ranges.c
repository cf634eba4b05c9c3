/*
 * vmm_ranges.c - the VMM table's reservations, with their chunk mappings and
 * access, and eviction (pure C, as vmm_table.c).
 *
 * Tracked reservations are the address ranges the app reserved right after
 * importing. A chunk (one mapping) is "adopted" while the app has it mapped,
 * "kept" after the app unmapped it while the real mapping stays. A
 * reservation the app freed while it still held kept chunks is idle: the app
 * sees nothing there, the driver sees it all.
 *
 * Which idle range a reserve gets back depends on the app's order. If it
 * imports first (and then reserves), the range whose kept chunks it just
 * imported. PyTorch reserves first (c10's ExpandableSegment::fromShared):
 * at the reserve only the thread's earlier rebuilds are known, so the range
 * whose last use mapped what followed those rebuilds last time
 * (vmm_predict.c), wherever it lies. Either way it is a guess the maps check:
 * a map of another allocation unmaps the kept one first, so a wrong guess
 * costs driver calls, never a wrong mapping.
 */
#include <stdlib.h>
#include <string.h>

#include "vmm_table_impl.h"

/* ---- reservations: finding ------------------------------------------------ */

static int overlaps(uint64_t a, uint64_t an, uint64_t b, uint64_t bn)
{
    return a < b + bn && b < a + an;
}

/* The tracked reservation containing addr; NULL if none. */
static struct ipcc_vmm_range *res_at(const struct ipcc_vmm_table *t, uint64_t addr, size_t *index)
{
    for (size_t i = 0; i < t->nres; i++) {
        struct ipcc_vmm_range *r = t->res[i];
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
static struct ipcc_vmm_range *live_res(const struct ipcc_vmm_table *t, uint64_t addr,
                             enum ipcc_vmm_verdict *v)
{
    struct ipcc_vmm_range *r = res_at(t, addr, NULL);
    *v = r ? IPCC_VMM_INVALID : IPCC_VMM_PASS;
    return r && !r->idle ? r : NULL;
}

static void set_idle(struct ipcc_vmm_table *t, struct ipcc_vmm_range *r, int idle)
{
    if (r->idle != idle)
        ipcc_vmm_gauge_add(&t->gauges.idle_reservations, idle ? 1 : -1);
    r->idle = idle;
}

/* Starts tracking a reservation the app just made. -1: out of memory (the
 * reservation then simply goes uncached). */
int ipcc_vmm_reserve_track(struct ipcc_vmm_table *t, uint64_t addr, uint64_t size)
{
    if (ipcc_vmm_grow((void **)&t->res, &t->capres, t->nres + 1, sizeof(*t->res)) < 0)
        return -1;
    struct ipcc_vmm_range *r = ipcc_mem_calloc(1, sizeof(*r));
    if (!r)
        return -1;
    r->addr = addr;
    r->size = size;
    t->res[t->nres++] = r;
    return 0;
}

/* An idle range a reserve of size (aligned to align) may have. */
static int fits(const struct ipcc_vmm_range *r, uint64_t size, uint64_t align)
{
    return r && r->idle && r->size == size && (align == 0 || r->addr % align == 0);
}

static int hand_back(struct ipcc_vmm_table *t, struct ipcc_vmm_range *r, uint64_t now_ns,
                     uint64_t *addr)
{
    set_idle(t, r, 0);
    r->blind = 0; /* a new reservation to the app: nothing of its own in it */
    r->key = 0;   /* nothing mapped by this use yet */
    r->last_ns = now_ns;
    *addr = r->addr;
    return 1;
}

static int in_list(uint64_t h, const uint64_t *list, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (list[i] == h)
            return 1;
    return 0;
}

/* Every kept chunk of r is one of the handles just imported. */
static int chunks_match(const struct ipcc_vmm_range *r, const uint64_t *handles, size_t n)
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
    struct ipcc_vmm_range *best = NULL;
    for (size_t i = 0; i < t->nres; i++) {
        struct ipcc_vmm_range *r = t->res[i];
        if (fits(r, size, align) && (!best || r->last_ns > best->last_ns) &&
            chunks_match(r, handles, n))
            best = r;
    }
    return best ? hand_back(t, best, now_ns, addr) : 0;
}

/* A rebuild of this thread (history h) that mapped key just ended (its
 * thread reserves again): learnt as what follows h's rebuilds. */
void ipcc_vmm_rebuild_done(struct ipcc_vmm_table *t, struct ipcc_vmm_history *h, uint64_t key)
{
    ipcc_vmm_predict_learn(&t->predict, h, key);
}

/* The most recently used idle range of size (aligned to align) whose last
 * use mapped key; NULL if none. */
static struct ipcc_vmm_range *idle_with_key(const struct ipcc_vmm_table *t, uint64_t size,
                                            uint64_t align, uint64_t key)
{
    struct ipcc_vmm_range *best = NULL;
    for (size_t i = 0; i < t->nres; i++) {
        struct ipcc_vmm_range *r = t->res[i];
        if (r->key == key && fits(r, size, align) && (!best || r->last_ns > best->last_ns))
            best = r;
    }
    return best;
}

/* An idle range of size (aligned to align) that no rebuild needs more than
 * another (another idle one holds what it holds), when such spares are a
 * quarter of the tracked ranges or more; NULL otherwise. Below that a
 * rebuild missing its range reserves a new one (there next time: in-order
 * shapes heal); above, orders nothing predicts stop reserving ever more. */
static struct ipcc_vmm_range *spare(const struct ipcc_vmm_table *t, uint64_t size, uint64_t align)
{
    struct ipcc_vmm_range *first = NULL;
    size_t spares = 0;
    for (size_t i = 0; i < t->nres; i++) {
        struct ipcc_vmm_range *r = t->res[i];
        for (size_t k = i + 1; fits(r, size, align) && k < t->nres; k++) {
            if (t->res[k]->key == r->key && fits(t->res[k], size, align)) {
                first = first ? first : r;
                spares++;
                break;
            }
        }
    }
    return spares * 4 >= t->nres ? first : NULL;
}

/*
 * A reserve that comes before its imports (PyTorch's order), in a thread
 * whose rebuilds so far are h: hands back an idle range (of size, aligned to
 * align) whose last use mapped what followed h's rebuilds last time
 * (vmm_predict.c), the most recently used first. Failing that, a spare one, so that orders
 * nothing predicts reuse ranges rather than reserving ever more (the one a
 * rebuild needs is reserved anew: the next time it is there). 1 and *addr
 * set, or 0.
 */
int ipcc_vmm_reserve_next(struct ipcc_vmm_table *t, uint64_t size, uint64_t align,
                          const struct ipcc_vmm_history *h, uint64_t now_ns, uint64_t *addr)
{
    uint64_t key = ipcc_vmm_predict_next(&t->predict, h);
    struct ipcc_vmm_range *r = key ? idle_with_key(t, size, align, key) : NULL;
    if (!r)
        r = spare(t, size, align);
    return r ? hand_back(t, r, now_ns, addr) : 0;
}

static int overlaps_tracked(const struct ipcc_vmm_table *t, uint64_t addr, uint64_t size)
{
    for (size_t i = 0; i < t->nres; i++)
        if (overlaps(addr, size, t->res[i]->addr, t->res[i]->size))
            return 1;
    return 0;
}

/*
 * The app mapped handle at addr, inside [raddr, raddr+rsize): the latest
 * reservation of this thread. When handle is one of our imports, that
 * reservation holds a rebuild: tracked from now on if it was not (PyTorch
 * imports after its reserve). 1, or 0 when handle is not ours (the app's own
 * memory) or it cannot be tracked.
 */
int ipcc_vmm_reserve_mapped(struct ipcc_vmm_table *t, uint64_t raddr, uint64_t rsize,
                            uint64_t addr, uint64_t handle)
{
    if (!ipcc_vmm_import_of(t, handle))
        return 0;
    struct ipcc_vmm_range *r = res_at(t, addr, NULL);
    if (!r) {
        if (overlaps_tracked(t, raddr, rsize) || ipcc_vmm_reserve_track(t, raddr, rsize) < 0)
            return 0;
        r = t->res[t->nres - 1];
        r->blind = 1; /* the app may have mapped its own memory here already */
    }
    return 1;
}

/* ---- chunks ---------------------------------------------------------------- */

static void chunk_pin(struct ipcc_vmm_table *t, struct ipcc_vmm_chunk *c, int adopted, int delta)
{
    if (!c->imp)
        return;
    if (adopted)
        c->imp->live_pins += (uint64_t)(int64_t)delta;
    else
        c->imp->kept_pins += (uint64_t)(int64_t)delta;
    ipcc_vmm_account(t, c->imp);
}

static void chunk_adopt(struct ipcc_vmm_table *t, struct ipcc_vmm_chunk *c, int adopted)
{
    if (c->adopted == adopted)
        return;
    chunk_pin(t, c, c->adopted, -1);
    c->adopted = adopted;
    chunk_pin(t, c, c->adopted, +1);
}

static void chunk_remove(struct ipcc_vmm_table *t, struct ipcc_vmm_range *r, size_t i)
{
    chunk_pin(t, &r->chunks[i], r->chunks[i].adopted, -1);
    memmove(&r->chunks[i], &r->chunks[i + 1], (r->n - i - 1) * sizeof(*r->chunks));
    r->n--;
}

/* Kept chunks overlapping [addr, addr+size) give way: removed, and their
 * real unmaps queued, so that the driver sees what the app sees there. */
static void give_way(struct ipcc_vmm_table *t, struct ipcc_vmm_range *r, uint64_t addr,
                     uint64_t size, struct ipcc_vmm_ops *ops)
{
    for (size_t i = r->n; i-- > 0;) {
        struct ipcc_vmm_chunk *c = &r->chunks[i];
        if (!c->adopted && overlaps(addr, size, c->addr, c->size)) {
            ipcc_vmm_ops_push(ops, IPCC_VMM_UNMAP, c->addr, c->size, 0, -1);
            chunk_remove(t, r, i);
        }
    }
}

/* The chunks in [addr, addr+size) are whole, adopted when asked, and start
 * and end the range; with no_holes, they also cover it. */
static int whole_chunks(const struct ipcc_vmm_range *r, uint64_t addr, uint64_t size, int no_holes,
                        size_t *first, size_t *last)
{
    size_t n = 0;
    uint64_t expect = addr;
    for (size_t i = 0; i < r->n; i++) {
        const struct ipcc_vmm_chunk *c = &r->chunks[i];
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
    struct ipcc_vmm_range *r = live_res(t, addr, &v);
    if (!r)
        return v;
    for (size_t i = 0; i < r->n; i++) {
        struct ipcc_vmm_chunk *c = &r->chunks[i];
        if (c->addr == addr && c->size == size && !c->adopted && c->imp &&
            c->imp->handle == handle) {
            chunk_adopt(t, c, 1);
            c->nseen = 0; /* the app's new mapping: no access yet */
            c->imp->last_ns = now_ns;
            r->last_ns = now_ns;
            r->key = ipcc_vmm_rebuild_key(r->key, addr - r->addr, handle);
            return IPCC_VMM_DONE;
        }
    }
    give_way(t, r, addr, size, ops);
    return IPCC_VMM_PASS;
}

/* Records the app's successful real map. */
void ipcc_vmm_map_done(struct ipcc_vmm_table *t, uint64_t addr, uint64_t size, uint64_t handle)
{
    struct ipcc_vmm_range *r = res_at(t, addr, NULL);
    if (!r || ipcc_vmm_grow((void **)&r->chunks, &r->cap, r->n + 1, sizeof(*r->chunks)) < 0)
        return; /* untracked or no memory: a chunk we do not know is never kept */
    size_t at = 0;
    while (at < r->n && r->chunks[at].addr < addr)
        at++;
    memmove(&r->chunks[at + 1], &r->chunks[at], (r->n - at) * sizeof(*r->chunks));
    r->n++;
    struct ipcc_vmm_chunk *c = &r->chunks[at];
    memset(c, 0, sizeof(*c));
    c->addr = addr;
    c->size = size;
    c->imp = ipcc_vmm_import_of(t, handle);
    c->adopted = 1;
    if (c->imp) {
        c->imp->bytes = size; /* a map covers exactly its allocation */
        r->key = ipcc_vmm_rebuild_key(r->key, addr - r->addr, handle);
    }
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
    struct ipcc_vmm_range *r = live_res(t, addr, &v);
    if (!r)
        return v;
    size_t first, last;
    /* Holes are unmapped, unless the range is blind: then one may hold a
     * mapping we never saw, which the driver must unmap. */
    if (size && addr + size <= r->addr + r->size &&
        whole_chunks(r, addr, size, r->blind, &first, &last)) {
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
    struct ipcc_vmm_range *r = res_at(t, addr, NULL);
    for (size_t i = r ? r->n : 0; i-- > 0;) {
        struct ipcc_vmm_chunk *c = &r->chunks[i];
        if (c->addr >= addr && c->addr + c->size <= addr + size)
            chunk_remove(t, r, i);
    }
}

/* ---- access ------------------------------------------------------------------- */

/* Sets a's grant in g[0..*n); *n -1: forgotten (more devices than fit). */
static void grant_set(struct ipcc_vmm_grant *g, int *n, const struct ipcc_vmm_access *a)
{
    if (*n < 0)
        return;
    for (int i = 0; i < *n; i++) {
        if (g[i].dev == a->dev) {
            g[i].flags = a->flags;
            return;
        }
    }
    if (*n == IPCC_VMM_MAX_ACCESS) {
        *n = -1; /* forget: never skip (or answer) on this chunk again */
        return;
    }
    g[(*n)++] = (struct ipcc_vmm_grant){ a->dev, a->flags };
}

/* The app set acc (NULL: something we cannot follow) on c: what it sees,
 * and, if real, what the driver has. */
static void chunk_set(struct ipcc_vmm_chunk *c, const struct ipcc_vmm_access *acc, size_t n,
                      int real)
{
    if (!acc) {
        c->naccess = c->nseen = -1;
        return;
    }
    for (size_t k = 0; k < n; k++) {
        grant_set(c->seen, &c->nseen, &acc[k]);
        if (real)
            grant_set(c->access, &c->naccess, &acc[k]);
    }
}

static int chunk_has(const struct ipcc_vmm_chunk *c, const struct ipcc_vmm_access *a)
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
    struct ipcc_vmm_range *r = live_res(t, addr, &v);
    if (!r)
        return v;
    size_t first, last;
    if (n > 0 && size && whole_chunks(r, addr, size, 1, &first, &last)) {
        int same = 1;
        for (size_t i = first; i <= last && same; i++)
            for (size_t k = 0; k < n && same; k++)
                same = chunk_has(&r->chunks[i], &acc[k]);
        for (size_t i = first; i <= last && same; i++)
            chunk_set(&r->chunks[i], acc, n, 0);
        if (same)
            return IPCC_VMM_DONE;
    }
    give_way(t, r, addr, size, ops);
    return IPCC_VMM_PASS;
}

/* The real set-access succeeded: remember it, in the driver's order (acc
 * NULL: descriptors we do not follow; forget what we knew). */
void ipcc_vmm_set_access_done(struct ipcc_vmm_table *t, uint64_t addr, uint64_t size,
                              const struct ipcc_vmm_access *acc, size_t n)
{
    struct ipcc_vmm_range *r = res_at(t, addr, NULL);
    for (size_t i = 0; r && i < r->n; i++) {
        struct ipcc_vmm_chunk *c = &r->chunks[i];
        if (c->addr >= addr && c->addr + c->size <= addr + size)
            chunk_set(c, acc, n, 1);
    }
}

/* What the app sees of dev's access at addr, where the table knows it
 * better than the driver (an adopted chunk): 1 with *flags set, else 0. */
int ipcc_vmm_access_seen(const struct ipcc_vmm_table *t, uint64_t addr, int dev,
                         unsigned long long *flags)
{
    struct ipcc_vmm_range *r = res_at(t, addr, NULL);
    for (size_t i = 0; r && i < r->n; i++) {
        const struct ipcc_vmm_chunk *c = &r->chunks[i];
        if (addr < c->addr || addr >= c->addr + c->size)
            continue;
        if (!c->adopted || c->nseen < 0)
            return 0;
        *flags = 0;
        for (int k = 0; k < c->nseen; k++)
            if (c->seen[k].dev == dev)
                *flags = c->seen[k].flags;
        return 1;
    }
    return 0;
}

/* A call the table does not answer (get-access, a map with an offset...):
 * kept chunks in [addr, addr+size) give way first, since the app sees
 * nothing mapped there. INVALID: a freed range. */
enum ipcc_vmm_verdict ipcc_vmm_give_way(struct ipcc_vmm_table *t, uint64_t addr, uint64_t size,
                                        struct ipcc_vmm_ops *ops)
{
    enum ipcc_vmm_verdict v;
    struct ipcc_vmm_range *r = live_res(t, addr, &v);
    if (!r)
        return v;
    give_way(t, r, addr, size ? size : 1, ops);
    return IPCC_VMM_PASS;
}

/* ---- address free, eviction ----------------------------------------------------- */

static void res_remove(struct ipcc_vmm_table *t, size_t index)
{
    struct ipcc_vmm_range *r = t->res[index];
    set_idle(t, r, 0);
    ipcc_mem_free(r->chunks);
    ipcc_mem_free(r);
    t->res[index] = t->res[--t->nres];
}

/* Queues the real teardown of reservation index: its kept chunks, the range,
 * and (release_imports) the imports left with no use at all. */
static void res_evict(struct ipcc_vmm_table *t, size_t index, int release_imports,
                      struct ipcc_vmm_ops *ops)
{
    struct ipcc_vmm_range *r = t->res[index];
    while (r->n > 0) {
        struct ipcc_vmm_chunk c = r->chunks[r->n - 1];
        ipcc_vmm_ops_push(ops, IPCC_VMM_UNMAP, c.addr, c.size, 0, -1);
        chunk_remove(t, r, r->n - 1);
        if (release_imports && c.imp && ipcc_vmm_import_lone_idle(c.imp))
            ipcc_vmm_drop_import(t, c.imp, ops);
    }
    ipcc_vmm_ops_push(ops, IPCC_VMM_FREE, r->addr, r->size, 0, -1);
    res_remove(t, index);
}

/* The chunks fill r from end to end: no room for a mapping we never saw. */
static int covered(const struct ipcc_vmm_range *r)
{
    uint64_t expect = r->addr;
    for (size_t i = 0; i < r->n; i++) {
        if (r->chunks[i].addr != expect)
            return 0;
        expect += r->chunks[i].size;
    }
    return expect == r->addr + r->size;
}

/*
 * The app frees [addr, addr+size). DONE_OK: exactly a tracked reservation
 * with no mapping the app still sees, but kept chunks: it becomes idle.
 * INVALID: freed already. PASS: the driver answers. Exactly a tracked
 * reservation with nothing in it is forgotten now: once the driver has freed
 * it, another thread may reserve the same addresses before we could look
 * again (if the driver refuses, the range just goes uncached). So is a blind
 * one with room for a mapping we never saw, its kept chunks unmapped first:
 * the driver decides on what the app mapped alone.
 */
enum ipcc_vmm_verdict ipcc_vmm_free(struct ipcc_vmm_table *t, uint64_t addr, uint64_t size,
                                    uint64_t now_ns, struct ipcc_vmm_ops *ops)
{
    enum ipcc_vmm_verdict v;
    size_t index;
    struct ipcc_vmm_range *r = live_res(t, addr, &v);
    if (!r)
        return v;
    if (r->addr != addr || r->size != size)
        return IPCC_VMM_PASS;
    for (size_t i = 0; i < r->n; i++)
        if (r->chunks[i].adopted)
            return IPCC_VMM_PASS;
    if ((r->n == 0 || (r->blind && !covered(r))) && res_at(t, addr, &index) == r) {
        give_way(t, r, r->addr, r->size, ops);
        res_remove(t, index);
        return IPCC_VMM_PASS;
    }
    set_idle(t, r, 1);
    r->last_ns = now_ns;
    return IPCC_VMM_DONE;
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

/* Idle as the caps count it (ipcc_vmm_account): neither held nor mapped by
 * the app; alone, or kept mapped where the app unmapped it, also in a
 * reservation the app still holds. */
static int import_idle(const struct ipcc_vmm_import *m)
{
    return m->refs == 0 && m->live_pins == 0;
}

/* The least recently used idle thing: an idle reservation (*res set) or an
 * idle import (*imp set), when it last went idle in *ns. 0 when nothing is
 * idle. */
static int oldest_idle(const struct ipcc_vmm_table *t, long *res, long *imp, uint64_t *ns)
{
    *res = *imp = -1;
    *ns = UINT64_MAX;
    for (size_t i = 0; i < t->nres; i++) {
        if (t->res[i]->idle && t->res[i]->last_ns <= *ns) {
            *ns = t->res[i]->last_ns;
            *res = (long)i;
        }
    }
    for (size_t i = 0; i < t->nimports; i++) {
        struct ipcc_vmm_import *m = t->by_id[i];
        if (import_idle(m) && m->last_ns < *ns) {
            *ns = m->last_ns;
            *imp = (long)i;
            *res = -1;
        }
    }
    return *res >= 0 || *imp >= 0;
}

/* When the least recently used idle thing went idle: 1 and *ns set, or 0.
 * The budget shared with the legacy path compares it with that path's
 * oldest idle mapping (budget_tables.c). */
int ipcc_vmm_oldest_idle(const struct ipcc_vmm_table *t, uint64_t *ns)
{
    long res, imp;
    return oldest_idle(t, &res, &imp, ns);
}

/* Queues the teardown of an idle import: its kept chunks unmapped (the idle
 * reservations holding one torn down whole, with the imports only they
 * used), then the import released. 0 if it could not be (nothing queued). */
static int import_evict(struct ipcc_vmm_table *t, struct ipcc_vmm_import *m,
                        struct ipcc_vmm_ops *ops)
{
    uint64_t handle = m->handle; /* m may go with an idle reservation */
    for (size_t i = t->nres; i-- > 0 && m->kept_pins > 0;) {
        struct ipcc_vmm_range *r = t->res[i];
        for (size_t k = r->n; k-- > 0;) {
            if (r->chunks[k].imp != m)
                continue;
            if (r->idle) {
                res_evict(t, i, 1, ops);
                break;
            }
            ipcc_vmm_ops_push(ops, IPCC_VMM_UNMAP, r->chunks[k].addr, r->chunks[k].size, 0, -1);
            chunk_remove(t, r, k);
        }
        m = ipcc_vmm_import_of(t, handle);
        if (!m)
            return 1;
    }
    if (!ipcc_vmm_import_lone_idle(m))
        return 0; /* pinned by a chunk no range holds: cannot be */
    ipcc_vmm_drop_import(t, m, ops);
    return 1;
}

/* Queues the teardown of the least recently used idle thing (a reservation
 * with the imports only it used, or an import). 0 when nothing is idle. */
int ipcc_vmm_evict_one(struct ipcc_vmm_table *t, struct ipcc_vmm_ops *ops)
{
    long res, imp;
    uint64_t ns;
    if (!oldest_idle(t, &res, &imp, &ns))
        return 0;
    if (imp >= 0)
        return import_evict(t, t->by_id[imp], ops);
    res_evict(t, (size_t)res, 1, ops);
    return 1;
}

/* ---- an exporter's release (vmm_importer.c) ------------------------------------- */

static int from_tag(const struct ipcc_vmm_import *m, const void *tag)
{
    return m && m->tagged && memcmp(m->tag, tag, IPCC_HANDLE_BYTES) == 0;
}

/*
 * The exporter of tag is releasing it: queues the teardown of every idle
 * reservation holding a kept chunk of it, unmaps its kept chunks in live
 * reservations, and drops its imports nothing uses any more. Imports the app
 * still holds or maps stay: counted in *live, their bytes in *live_bytes.
 * Returns how many imports were dropped.
 */
size_t ipcc_vmm_take_idle_by_tag(struct ipcc_vmm_table *t, const void *tag,
                                 struct ipcc_vmm_ops *ops, size_t *live, uint64_t *live_bytes)
{
    for (size_t i = t->nres; i-- > 0;) {
        struct ipcc_vmm_range *r = t->res[i];
        for (size_t k = r->n; k-- > 0;) {
            struct ipcc_vmm_chunk *c = &r->chunks[k];
            if (c->adopted || !from_tag(c->imp, tag))
                continue;
            if (r->idle) {
                res_evict(t, i, 0, ops);
                break;
            }
            ipcc_vmm_ops_push(ops, IPCC_VMM_UNMAP, c->addr, c->size, 0, -1);
            chunk_remove(t, r, k);
        }
    }
    size_t dropped = 0;
    for (size_t i = t->nimports; i-- > 0;) {
        struct ipcc_vmm_import *m = t->by_id[i];
        if (!from_tag(m, tag))
            continue;
        if (ipcc_vmm_import_lone_idle(m)) {
            ipcc_vmm_drop_import(t, m, ops);
            dropped++;
        } else {
            (*live)++;
            *live_bytes += m->bytes;
        }
    }
    return dropped;
}
