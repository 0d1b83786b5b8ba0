/* benchmarks/scan_floor.py's probe: a lower bound for the cold index's reading of a run log.
 *
 * Reads the log as the server does, in slices (the server's 64 KiB by default), splits it into
 * lines, and takes every numeric value of each line's flat JSON object into a float64 column per
 * key. Nothing else: no validation, no Python objects, no records, buckets, alarms or sidecar. Not
 * the server's grammar (scanlines.c is); a number is read by Clinger's fast path (up to 15
 * significant digits and 22 decimals: one correctly rounded division, as CPython's float() gives),
 * else by strtod. Prints one JSON object: the seconds, the lines, and per key its count, its sum (in
 * file order) and the XOR of its values' bits (hex): a Python reading of the same log gives the same
 * three, bit for bit.
 *
 *   scan_floor LOG [SLICE_BYTES]
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_KEYS 256
#define MAX_LINE (1 << 20)

typedef struct {
    char name[64];
    size_t len;
    double *col;
    size_t n, cap;
} Column;

static Column columns[MAX_KEYS];
static int ncolumns;
static long lines;
static const double P10[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                             1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

static Column *column(const char *name, size_t len) {
    for (int i = 0; i < ncolumns; i++)
        if (columns[i].len == len && memcmp(columns[i].name, name, len) == 0)
            return &columns[i];
    if (ncolumns == MAX_KEYS || len >= sizeof columns[0].name)
        return NULL;
    Column *c = &columns[ncolumns++];
    memcpy(c->name, name, len);
    c->len = len;
    c->cap = 1 << 16;
    c->col = malloc(sizeof(double) * c->cap);
    return c;
}

static void append(Column *c, double v) {
    if (c->n == c->cap) {
        c->cap *= 2;
        c->col = realloc(c->col, sizeof(double) * c->cap);
    }
    c->col[c->n++] = v;
}

/* A JSON number at s (its end in *end; *end == s: none). */
static double number(const char *s, const char *e, const char **end) {
    const char *p = s;
    int negative = p < e && *p == '-';
    p += negative;
    unsigned long long m = 0;
    int digits = 0, decimals = 0, any = 0;
    for (; p < e && *p >= '0' && *p <= '9'; p++, any = 1)
        if ((m = m * 10 + (unsigned)(*p - '0')) != 0)
            digits++;
    if (p < e && *p == '.')
        for (p++; p < e && *p >= '0' && *p <= '9'; p++, decimals++, any = 1)
            if ((m = m * 10 + (unsigned)(*p - '0')) != 0)
                digits++;
    *end = s;
    if (!any)
        return 0.0;
    if ((p < e && (*p == 'e' || *p == 'E')) || digits > 15 || decimals > 22) {
        char *stop;
        double v = strtod(s, &stop);
        *end = stop;
        return v;
    }
    *end = p;
    double v = (double)m / P10[decimals];
    return negative ? -v : v;
}

static void line(const char *p, const char *e) {
    lines++;
    while (p < e) {
        const char *q = memchr(p, '"', (size_t)(e - p));
        if (q == NULL)
            return;
        const char *r = memchr(q + 1, '"', (size_t)(e - q - 1));
        if (r == NULL)
            return;
        const char *v = r + 1;
        while (v < e && *v == ' ')
            v++;
        if (v >= e || *v != ':') {  /* (a string value: skip it) */
            p = r + 1;
            continue;
        }
        for (v++; v < e && *v == ' '; v++)
            ;
        const char *end;
        double x = number(v, e, &end);
        if (end > v) {
            Column *c = column(q + 1, (size_t)(r - q - 1));
            if (c != NULL)
                append(c, x);
            p = end;
        } else {
            p = v;
        }
    }
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: scan_floor LOG [SLICE_BYTES]\n");
        return 2;
    }
    int fd = open(argv[1], O_RDONLY);
    if (fd < 0) {
        perror(argv[1]);
        return 1;
    }
    size_t slice = argc > 2 ? (size_t)atol(argv[2]) : 65536;
    char *buf = malloc(slice + MAX_LINE);
    size_t held = 0;
    ssize_t got;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while ((got = read(fd, buf + held, slice)) > 0) {
        held += (size_t)got;
        char *p = buf, *e = buf + held, *nl;
        while ((nl = memchr(p, '\n', (size_t)(e - p))) != NULL) {
            line(p, nl);
            p = nl + 1;
        }
        held = (size_t)(e - p);
        if (held > MAX_LINE)
            held = 0;  /* (an oversize line: dropped, as the server skips it) */
        memmove(buf, p, held);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("{\"seconds\": %.6f, \"lines\": %ld, \"slice\": %zu, \"columns\": {",
           (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9, lines, slice);
    for (int i = 0; i < ncolumns; i++) {
        double sum = 0.0;
        unsigned long long bits = 0, b;
        for (size_t k = 0; k < columns[i].n; k++) {
            sum += columns[i].col[k];
            memcpy(&b, &columns[i].col[k], sizeof b);
            bits ^= b;
        }
        printf("%s\"%.*s\": [%zu, %.17g, \"%016llx\"]", i ? ", " : "", (int)columns[i].len, columns[i].name,
               columns[i].n, sum, bits);
    }
    printf("}}\n");
    return 0;
}
