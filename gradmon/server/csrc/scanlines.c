/* gradmon's compiled line scanner: a batch of run-log lines -> the step records' columns.
 *
 * Built at first use into the per-user cache by gradmon/server/native.py (never required: without
 * a C compiler the index runs the same rules in Python, parse.py, which is the reference).
 *
 * scan_steps(texts) takes a list of lines (bytes, or None for an oversize line) and returns
 * (shapes, undecided, columns, types, floats, rows, not_steps):
 *   shapes     [(first_row, keys)]: where the step records' keys (a tuple, in the line's order)
 *              change, from the first step record on; no dict is made (most records are read
 *              only a column at a time: steprecords.StepRecords makes one when it is read);
 *   undecided  the positions of the lines this scanner does not decide (the caller's orjson and
 *              decode_record do, as without it);
 *   columns    {key: list} over the step records in order, None where a record lacks the key
 *              (parse.KeyColumns.values); None for a key whose every value is a float, of which
 *              no object is made (most such columns are never read as objects; the float64
 *              column holds them: steprecords.scanned_column makes the list when it is read);
 *   types      {key: bit mask of int 1, float 2, str 4, bool 8, None 16} (KeyColumns.types), and 32
 *              where one of its floats is not finite (a "NaN", "Infinity" or "-Infinity" string);
 *   floats     {key: bytes}: the column as native float64s, MISSING_BITS where no number (a bool,
 *              text, null or no value: columns.step_rows' reading of values.number);
 *   rows       how many step records;
 *   not_steps  the positions of the lines without one.
 * A line is decided when it is one compact or spaced JSON object filling the whole line whose keys
 * are distinct and whose values are strings, numbers, true, false or null, with a string "type":
 * a step record when that is "step", else a record of another kind (in not_steps, decided: the
 * caller's decode_record reads those). Strings must be printable ASCII without escapes and not end
 * with "NaN" or "Infinity", except the values "NaN", "Infinity" and "-Infinity" of a key that is not
 * one of text_keys(): the floats decode_record turns those into (jsonl.NONFINITE_STRINGS); a module
 * whose text_keys() were not given reads none (their lines are undecided); integers up to 2^53 in size;
 * numbers are read as CPython's float parser reads them, bit for bit (Clinger's and Eisel and
 * Lemire's exact paths, else that parser itself); anything else (nested values, escapes, UTF-8,
 * huge or infinite numbers, a missing "type", a repeated key) is left undecided, so that what this
 * scanner decides is exactly what orjson and the standard library read.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

enum { T_INT = 1, T_FLOAT = 2, T_STR = 4, T_BOOL = 8, T_NONE = 16, T_NONFINITE = 32 };
/* columns.MISSING_BITS: a quiet NaN no JSON value decodes to, "no number" in the sidecar's rows. */
#define MISSING_BITS 0x7FF80000DEADBEEFULL
#define MAX_KEYS 512        /* distinct keys per batch: beyond, lines with new keys are undecided */
#define MAX_FIELDS 256      /* keys per line: beyond, the line is undecided */
#define MAX_NUMBER 64       /* characters of a number token */

typedef struct {
    const char *name;       /* the key's bytes, inside a line of the batch (alive for the call) */
    Py_ssize_t len;
    PyObject *key;          /* str */
    PyObject *column;       /* list of the step records' values, NULL until a step record has it
                             * (made with a slot for every line, cut to the step records at the end) */
    Py_ssize_t filled;      /* rows of column written */
    Py_ssize_t seen;        /* the line that last had this key (a repeated key: undecided) */
    int mask;
    int nonfinite;          /* some float of the column is not finite (T_NONFINITE in its types) */
    int text;               /* one of text_keys(): its "NaN" is a string (undecided), not a float */
    double *floats;         /* the column as float64s (MISSING where no number), as column */
    /* The value token of the last step record that had this key, and what it was read as: the
     * same bytes again are the same value (a constant lr, epoch, loss scale...), not parsed again. */
    const unsigned char *last_tok;
    Py_ssize_t last_len;
    PyObject *last_val;     /* borrowed: column holds it */
    double last_num;
    int last_kind;
} Entry;

typedef struct {
    Entry entries[MAX_KEYS];
    Py_ssize_t n;
} Table;

static PyObject *STEP;      /* "step" */
static PyObject *TEXT_KEYS; /* text_keys(): the keys whose values decode_record keeps as text */

static double missing(void) {
    unsigned long long bits = MISSING_BITS;
    double d;
    memcpy(&d, &bits, sizeof d);
    return d;
}

#define IS_WS(c) ((c) == ' ' || (c) == '\t' || (c) == '\r')
#define ENDS_VALUE(c) (IS_WS(c) || (c) == ',' || (c) == '}')

/* A string's span (after the opening quote) up to its closing quote; -1 when not plain. */
static Py_ssize_t plain_string(const unsigned char *p, const unsigned char *end) {
    const unsigned char *s = p;
    while (p < end) {
        unsigned char c = *p;
        if (c == '"') {
            Py_ssize_t n = p - s;
            if ((n >= 3 && memcmp(p - 3, "NaN", 3) == 0) || (n >= 8 && memcmp(p - 8, "Infinity", 8) == 0))
                return -1;
            return n;
        }
        if (c < 0x20 || c >= 0x7f || c == '\\')
            return -1;
        p++;
    }
    return -1;
}

/* The span of a string (after its opening quote) that is exactly "NaN", "Infinity" or "-Infinity"
 * before its closing quote, with *d the float decode_record reads it as; 0 for any other string. */
static Py_ssize_t nonfinite_string(const unsigned char *p, const unsigned char *end, double *d) {
    static const struct { const char *text; Py_ssize_t len; int sign; } SPECIAL[] = {
        {"NaN\"", 3, 0}, {"Infinity\"", 8, 1}, {"-Infinity\"", 9, -1}};
    for (int k = 0; k < 3; k++) {
        Py_ssize_t n = SPECIAL[k].len;
        if (end - p > n && memcmp(p, SPECIAL[k].text, (size_t)n + 1) == 0) {
            *d = SPECIAL[k].sign == 0 ? Py_NAN : SPECIAL[k].sign * Py_HUGE_VAL;
            return n;
        }
    }
    return 0;
}

/* Whether n bytes at a and b are the same: memcmp for the short spans of one line (keys and
 * value tokens, a few words), inlined 8 bytes at a time rather than a call per span. */
static inline int same_bytes(const unsigned char *a, const unsigned char *b, Py_ssize_t n) {
    for (; n >= 8; a += 8, b += 8, n -= 8) {
        unsigned long long x, y;
        memcpy(&x, a, 8);
        memcpy(&y, b, 8);
        if (x != y)
            return 0;
    }
    for (; n > 0; a++, b++, n--)
        if (*a != *b)
            return 0;
    return 1;
}

static Entry *find_key(Table *t, const char *name, Py_ssize_t len) {
    for (Py_ssize_t k = 0; k < t->n; k++) {
        Entry *e = &t->entries[k];
        if (e->len == len && memcmp(e->name, name, len) == 0)
            return e;
    }
    if (t->n >= MAX_KEYS)
        return NULL;
    PyObject *key = PyUnicode_FromStringAndSize(name, len);
    if (key == NULL)
        return NULL;
    PyUnicode_InternInPlace(&key);
    Entry *e = &t->entries[t->n++];
    e->name = name;
    e->len = len;
    e->key = key;
    e->column = NULL;
    e->filled = 0;
    e->seen = -1;
    e->mask = 0;
    e->nonfinite = 0;
    e->text = TEXT_KEYS == NULL ? 1 : PySet_Contains(TEXT_KEYS, key);
    if (e->text < 0) {
        t->n--;
        Py_DECREF(key);
        return NULL;
    }
    e->floats = NULL;
    e->last_tok = NULL;
    e->last_len = 0;
    return e;
}

/* Past one or more digits at p; NULL when there is none (a fraction's or an exponent's). */
static const unsigned char *digits(const unsigned char *p, const unsigned char *end) {
    if (p >= end || *p < '0' || *p > '9')
        return NULL;
    while (p < end && *p >= '0' && *p <= '9')
        p++;
    return p;
}

/* The powers of ten a double holds exactly (Clinger's fast path). */
static const double POW10[] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
                               1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* POW10_MIN, POW10_MAX and POWERS_OF_TEN[q - POW10_MIN] = {high, low}: the 128 leading bits of
 * 10^q, rounded down, for q in [POW10_MIN, POW10_MAX]. Written by native.py at build time from
 * Python's exact integers (no table to keep by hand). */
#include "powers_of_ten.h"

/* The 128-bit product a * b. (GRADMON_PORTABLE_MUL: the product of 32-bit halves even where the
 * compiler has a 128-bit integer, as tests/test_native_scanner.py builds it to read it.) */
static inline void mul_64(uint64_t a, uint64_t b, uint64_t *hi, uint64_t *lo) {
#if defined(__SIZEOF_INT128__) && !defined(GRADMON_PORTABLE_MUL)
    unsigned __int128 r = (unsigned __int128)a * b;
    *hi = (uint64_t)(r >> 64);
    *lo = (uint64_t)r;
#else
    uint64_t a0 = (uint32_t)a, a1 = a >> 32, b0 = (uint32_t)b, b1 = b >> 32;
    uint64_t p00 = a0 * b0, p01 = a0 * b1, p10 = a1 * b0, p11 = a1 * b1;
    uint64_t mid = (p00 >> 32) + (uint32_t)p01 + (uint32_t)p10;
    *lo = (mid << 32) | (uint32_t)p00;
    *hi = p11 + (p01 >> 32) + (p10 >> 32) + (mid >> 32);
#endif
}

static inline int leading_zeros(uint64_t x) {  /* (x != 0) */
#if defined(__GNUC__) || defined(__clang__)
    return __builtin_clzll(x);
#else
    int n = 0;
    for (; !(x >> 63); x <<= 1)
        n++;
    return n;
#endif
}

/* m * 10^q (m below 10^19, exact) in *out, correctly rounded: 1; or 0 where a 128-bit product
 * cannot be sure of the rounding (a near tie), the result is subnormal or infinite, or q is outside
 * the table, and the caller's exact parser decides. The Eisel-Lemire algorithm (D. Lemire, "Number
 * Parsing at a Gigabyte per Second", 2021), in the form Go's strconv and Wuffs use: its tests read
 * tens of millions of tokens alike with CPython's parser (tests/test_native_scanner.py). Sign-less:
 * the caller negates. Only where a token has more than 15 digits or a power of ten beyond 1e22
 * (Clinger's exact path takes the others): the float32 values a writer widens, time stamps. */
static int eisel_lemire(uint64_t m, int q, double *out) {
    if (m == 0) {
        *out = 0.0;
        return 1;
    }
    if (q < POW10_MIN || q > POW10_MAX)
        return 0;
    int clz = leading_zeros(m);
    m <<= clz;
    /* floor(q * log2(10)), exact as (217706 * q) >> 16 over the table's range (a floor, not C's
     * truncating division) */
    long long t = 217706LL * q;
    long long log2_floor = t >= 0 ? t / 65536 : -((-t + 65535) / 65536);
    uint64_t exp2 = (uint64_t)(log2_floor + 64 + 1023) - (uint64_t)clz;
    const uint64_t *pow = POWERS_OF_TEN[q - POW10_MIN];
    uint64_t hi, lo;
    mul_64(m, pow[0], &hi, &lo);
    if ((hi & 0x1FF) == 0x1FF && lo + m < m) {  /* near a tie: the table's low half decides */
        uint64_t yhi, ylo;
        mul_64(m, pow[1], &yhi, &ylo);
        uint64_t merged_hi = hi, merged_lo = lo + yhi;
        if (merged_lo < lo)
            merged_hi++;
        if ((merged_hi & 0x1FF) == 0x1FF && merged_lo + 1 == 0 && ylo + m < m)
            return 0;
        hi = merged_hi;
        lo = merged_lo;
    }
    uint64_t msb = hi >> 63;
    uint64_t mantissa = hi >> (msb + 9);  /* 54 bits */
    exp2 -= 1 ^ msb;
    if (lo == 0 && (hi & 0x1FF) == 0 && (mantissa & 3) == 1)
        return 0;  /* (exactly halfway, perhaps: the exact parser breaks the tie) */
    mantissa += mantissa & 1;  /* to 53 bits, rounded */
    mantissa >>= 1;
    if (mantissa >> 53) {
        mantissa >>= 1;
        exp2++;
    }
    if (exp2 - 1 >= 0x7FF - 1)
        return 0;  /* (subnormal, or beyond the largest double) */
    uint64_t bits = exp2 << 52 | (mantissa & 0x000FFFFFFFFFFFFFULL);
    memcpy(out, &bits, sizeof bits);
    return 1;
}

/* m * 10^e for a decimal significand m of `digits` digits (at most 19: exact in 64 bits), in *out,
 * correctly rounded: by Clinger's path (up to 15 digits and a power of ten up to 1e22, all exact:
 * one rounded operation) or Eisel and Lemire's; 0 where neither is sure (CPython's parser then). */
static int decimal_to_double(uint64_t m, int digits, int e, double *out) {
    if (digits <= 15 && e >= -22 && e <= 22) {
        *out = e < 0 ? (double)m / POW10[-e] : (double)m * POW10[e];
        return 1;
    }
    return eisel_lemire(m, e, out);
}

/* A float token read (its end p, its value d): *value the float object, or NULL when lazy (a
 * scan_steps column: made only where the column holds other values too, see there); NULL with
 * MemoryError where the object cannot be made. */
static inline const unsigned char *a_float(PyObject **value, double d, int lazy, const unsigned char *p) {
    if (lazy) {
        *value = NULL;
        return p;
    }
    *value = PyFloat_FromDouble(d);
    return *value == NULL ? NULL : p;
}

/* The common number token in one pass, -?(0|[1-9][0-9]*)(.[0-9]+)? with at most 19 significant
 * digits (exact in 64 bits; an integer at most 15, inside 2^53) and no exponent: its end, with
 * *value, *kind and *as_float as number() gives them (the same operations); NULL for any other
 * token, or one whose rounding Eisel and Lemire's path cannot be sure of, which number() reads in
 * full. */
static const unsigned char *plain_number(const unsigned char *p, const unsigned char *end, PyObject **value,
                                         int *kind, double *as_float, int lazy) {
    const unsigned char *s = p;
    int neg = p < end && *p == '-';
    unsigned long long m = 0;
    int sig = 0, frac = 0;
    p += neg;
    if (p < end && *p == '0') {
        p++;
    } else {
        for (; p < end && *p >= '0' && *p <= '9'; p++, sig++) {
            if (sig == 19)
                return NULL;
            m = m * 10 + (unsigned long long)(*p - '0');
        }
        if (sig == 0)
            return NULL;
    }
    if (p < end && *p == '.') {
        p++;
        if (p >= end || *p < '0' || *p > '9')
            return NULL;
        for (; p < end && *p >= '0' && *p <= '9'; p++, frac++) {
            /* (zeros before the first significant digit are not significant) */
            if ((m != 0 || *p != '0') && ++sig > 19)
                return NULL;
            m = m * 10 + (unsigned long long)(*p - '0');
        }
    }
    if ((p < end && (*p == 'e' || *p == 'E')) || p - s > MAX_NUMBER)
        return NULL;
    if (frac == 0) {  /* an integer: below 10^15, inside 2^53 */
        if (sig > 15)
            return NULL;
        long long v = neg ? -(long long)m : (long long)m;
        *value = PyLong_FromLongLong(v);
        *as_float = (double)v;
        *kind = T_INT;
    } else {
        double d;
        if (!decimal_to_double(m, sig, -frac, &d))
            return NULL;
        *as_float = neg ? -d : d;
        *kind = T_FLOAT;
        return a_float(value, *as_float, lazy, p);
    }
    return *value == NULL ? NULL : p;
}

/* A number token at p (JSON grammar); *value a new int or float, NULL when not decided here. */
static const unsigned char *number(const unsigned char *p, const unsigned char *end, PyObject **value, int *kind,
                                   double *as_float, int lazy) {
    const unsigned char *s = p;
    int is_float = 0;
    *value = NULL;
    const unsigned char *q = plain_number(p, end, value, kind, as_float, lazy);
    if (q != NULL || PyErr_Occurred())
        return q;
    if (p < end && *p == '-')
        p++;
    if (p >= end)
        return NULL;
    if (*p == '0') {
        p++;
    } else if (*p >= '1' && *p <= '9') {
        while (p < end && *p >= '0' && *p <= '9')
            p++;
    } else {
        return NULL;
    }
    const unsigned char *int_end = p;
    if (p < end && *p == '.') {
        if ((p = digits(p + 1, end)) == NULL)
            return NULL;
        is_float = 1;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < end && (*p == '+' || *p == '-'))
            p++;
        if ((p = digits(p, end)) == NULL)
            return NULL;
        is_float = 1;
    }
    Py_ssize_t n = p - s;
    if (n > MAX_NUMBER)
        return NULL;
    if (!is_float) {
        Py_ssize_t digits = int_end - s - (*s == '-');
        if (digits > 18)
            return NULL;  /* (a big integer: orjson and the standard library differ) */
        long long v = 0;
        for (const unsigned char *q = s + (*s == '-'); q < int_end; q++)
            v = v * 10 + (*q - '0');
        if (v > (1LL << 53))
            return NULL;  /* (two such integers may be one double: the float64 columns' min and max
                           * would not be the ones Python's comparisons find) */
        *value = PyLong_FromLongLong(*s == '-' ? -v : v);
        *as_float = (double)(*s == '-' ? -v : v);  /* (correctly rounded, as float(int)) */
        *kind = T_INT;
        return *value == NULL ? NULL : p;
    }
    /* The token's decimal significand m (up to 19 digits) and exponent e, read by
     * decimal_to_double; else CPython's parser itself. */
    {
        const unsigned char *q = s + (*s == '-');
        unsigned long long m = 0;
        int digits = 0, e = 0, after_point = 0;
        for (; q < p && *q != 'e' && *q != 'E'; q++) {
            if (*q == '.') {
                after_point = 1;
                continue;
            }
            e -= after_point;
            if (digits == 0 && *q == '0')
                continue;  /* (a leading zero) */
            if (++digits > 19)
                break;
            m = m * 10 + (unsigned long long)(*q - '0');
        }
        if (digits <= 19) {
            if (q < p) {  /* an exponent */
                const unsigned char *x = q + 1;
                int neg = 0, ev = 0;
                if (*x == '+' || *x == '-')
                    neg = *x++ == '-';
                for (; x < p && ev < 1000; x++)
                    ev = ev * 10 + (*x - '0');
                e += neg ? -ev : ev;
            }
            double d;
            if (decimal_to_double(m, digits, e, &d)) {
                *as_float = *s == '-' ? -d : d;
                *kind = T_FLOAT;
                return a_float(value, *as_float, lazy, p);
            }
        }
    }
    char buf[MAX_NUMBER + 1];
    memcpy(buf, s, n);
    buf[n] = '\0';
    char *stop = NULL;
    double d = PyOS_string_to_double(buf, &stop, NULL);
    if (d == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return NULL;
    }
    if (stop != buf + n || !isfinite(d))
        return NULL;  /* (1e999: orjson refuses it, the standard library reads inf) */
    *as_float = d;
    *kind = T_FLOAT;
    return a_float(value, d, lazy, p);
}

/* Scan one line: 1 decided (fields in ents/vals, *nf of them, *is_step set), 0 undecided, -1 error. */
static int scan_line(Table *t, const unsigned char *p, const unsigned char *end, Py_ssize_t line,
                     Entry **ents, PyObject **vals, int *kinds, double *nums, const unsigned char **toks,
                     Py_ssize_t *tlens, int *nf, int *is_step, Entry **order, int norder, int lazy) {
    int has_type = 0;
    *nf = 0;
    *is_step = 0;
    if (p >= end || *p != '{' || end[-1] != '}')
        return 0;
    p++;
    while (p < end && IS_WS(*p))
        p++;
    if (p < end && *p == '}')
        return 0;  /* {} has no type */
    for (;;) {
        if (p >= end || *p != '"' || *nf >= MAX_FIELDS)
            return 0;
        p++;
        /* The key the step record before had here, when these bytes spell it and its closing
         * quote: the same plain key, found without a look at the table. */
        Entry *e = *nf < norder ? order[*nf] : NULL;
        Py_ssize_t klen = e != NULL ? e->len : -1;
        if (e == NULL || end - p <= klen || p[klen] != '"' || !same_bytes(p, (const unsigned char *)e->name, klen)) {
            if ((klen = plain_string(p, end)) < 0)
                return 0;
            e = find_key(t, (const char *)p, klen);
            if (e == NULL)
                return PyErr_Occurred() ? -1 : 0;
        }
        if (e->seen == line)
            return 0;  /* a repeated key */
        e->seen = line;
        p += klen + 1;
        while (p < end && IS_WS(*p))
            p++;
        if (p >= end || *p != ':')
            return 0;
        p++;
        while (p < end && IS_WS(*p))
            p++;
        if (p >= end)
            return 0;
        PyObject *v = NULL;
        int kind = 0;
        double num = missing();
        const unsigned char *tok = p;
        unsigned char c = *p;
        Py_ssize_t last = e->last_len, special;
        if (e->last_tok != NULL && end - p > last && ENDS_VALUE(p[last]) && same_bytes(p, e->last_tok, last)) {
            v = e->last_val;  /* (the token ends where the last one did: the same JSON value) */
            Py_XINCREF(v);  /* (NULL: a lazy float) */
            kind = e->last_kind;
            num = e->last_num;
            p += last;
        } else if (c == '"' && !e->text && (special = nonfinite_string(p + 1, end, &num)) > 0) {
            if (a_float(&v, num, lazy, p) == NULL)
                return -1;
            kind = T_FLOAT;  /* (decode_record's float; its line is strict JSON as it stands) */
            p += special + 2;
        } else if (c == '"') {
            p++;
            Py_ssize_t slen = plain_string(p, end);
            if (slen < 0)
                return 0;
            if (slen == 4 && memcmp(p, "step", 4) == 0) {
                v = STEP;
                Py_INCREF(v);
            } else {
                v = PyUnicode_FromStringAndSize((const char *)p, slen);
                if (v == NULL)
                    return -1;
            }
            kind = T_STR;
            p += slen + 1;
        } else if (c == 't' && end - p >= 4 && memcmp(p, "true", 4) == 0) {
            v = Py_True; Py_INCREF(v); kind = T_BOOL; p += 4;
        } else if (c == 'f' && end - p >= 5 && memcmp(p, "false", 5) == 0) {
            v = Py_False; Py_INCREF(v); kind = T_BOOL; p += 5;
        } else if (c == 'n' && end - p >= 4 && memcmp(p, "null", 4) == 0) {
            v = Py_None; Py_INCREF(v); kind = T_NONE; p += 4;
        } else if (c == '-' || (c >= '0' && c <= '9')) {
            p = number(p, end, &v, &kind, &num, lazy);
            if (p == NULL)
                return PyErr_Occurred() ? -1 : 0;
        } else {
            return 0;  /* nested, or not JSON */
        }
        if (e->len == 4 && memcmp(e->name, "type", 4) == 0) {
            has_type = 1;  /* (a type that is no string: another kind of record) */
            *is_step = v == STEP;
        }
        ents[*nf] = e;
        vals[*nf] = v;
        kinds[*nf] = kind;
        nums[*nf] = num;
        toks[*nf] = tok;
        tlens[*nf] = p - tok;
        (*nf)++;
        while (p < end && IS_WS(*p))
            p++;
        if (p >= end)
            return 0;
        if (*p == ',') {
            p++;
            while (p < end && IS_WS(*p))
                p++;
            continue;
        }
        if (*p == '}' && p + 1 == end)
            return has_type ? 1 : 0;
        return 0;
    }
}

static void backfill(Entry *e, Py_ssize_t rows) {
    while (e->filled < rows) {
        Py_INCREF(Py_None);
        PyList_SET_ITEM(e->column, e->filled, Py_None);
        e->floats[e->filled] = missing();
        e->filled++;
        e->mask |= T_NONE;
    }
}

static void release(PyObject **vals, int nf) {
    for (int k = 0; k < nf; k++)
        Py_XDECREF(vals[k]);  /* (NULL: a lazy float) */
}

static void clear_table(Table *t) {
    for (Py_ssize_t k = 0; k < t->n; k++) {
        Py_XDECREF(t->entries[k].key);
        Py_XDECREF(t->entries[k].column);
        PyMem_Free(t->entries[k].floats);
    }
    t->n = 0;
}

/* What scan_line needs beside a line: the batch's key table and one slot per field of a line. */
typedef struct {
    Table *t;
    Entry **ents;
    Entry **order;
    PyObject **vals;
    int *kinds;
    double *nums;
    const unsigned char **toks;
    Py_ssize_t *tlens;
} Scratch;

/* Allocate a scratch: 0, or -1 with MemoryError set (then scratch_free it all the same). */
static int scratch_new(Scratch *s) {
    s->t = PyMem_Calloc(1, sizeof(Table));
    s->ents = PyMem_Malloc(sizeof(Entry *) * MAX_FIELDS);
    s->order = PyMem_Calloc(MAX_FIELDS, sizeof(Entry *));
    s->vals = PyMem_Malloc(sizeof(PyObject *) * MAX_FIELDS);
    s->kinds = PyMem_Malloc(sizeof(int) * MAX_FIELDS);
    s->nums = PyMem_Malloc(sizeof(double) * MAX_FIELDS);
    s->toks = PyMem_Malloc(sizeof(unsigned char *) * MAX_FIELDS);
    s->tlens = PyMem_Malloc(sizeof(Py_ssize_t) * MAX_FIELDS);
    if (s->t == NULL || s->ents == NULL || s->order == NULL || s->vals == NULL || s->kinds == NULL ||
        s->nums == NULL || s->toks == NULL || s->tlens == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static void scratch_free(Scratch *s) {
    if (s->t != NULL) {
        clear_table(s->t);
        PyMem_Free(s->t);
    }
    PyMem_Free(s->ents);
    PyMem_Free(s->order);
    PyMem_Free(s->vals);
    PyMem_Free(s->kinds);
    PyMem_Free(s->nums);
    PyMem_Free(s->toks);
    PyMem_Free(s->tlens);
}

/* scan_line of texts' line i (bytes, or None for an oversize line: undecided) with a scratch. */
static int scan_text(Scratch *s, PyObject *item, Py_ssize_t i, int *nf, int *is_step, int norder, int lazy) {
    *nf = 0;
    *is_step = 0;
    if (!PyBytes_Check(item))
        return 0;
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(item);
    return scan_line(s->t, p, p + PyBytes_GET_SIZE(item), i, s->ents, s->vals, s->kinds, s->nums, s->toks, s->tlens,
                     nf, is_step, s->order, norder, lazy);
}

static PyObject *scan_steps(PyObject *self, PyObject *texts) {
    (void)self;
    if (!PyList_Check(texts)) {
        PyErr_SetString(PyExc_TypeError, "scan_steps expects a list of bytes");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(texts);
    Scratch sc;
    int scratch = scratch_new(&sc);
    Table *t = sc.t;
    Entry **ents = sc.ents, **order = sc.order;
    PyObject **vals = sc.vals;
    int *kinds = sc.kinds;
    double *nums = sc.nums;
    const unsigned char **toks = sc.toks;
    Py_ssize_t *tlens = sc.tlens;
    PyObject *shapes = PyList_New(0);
    PyObject *undecided = PyList_New(0);
    PyObject *not_steps = PyList_New(0);
    PyObject *columns = NULL, *types = NULL, *floats = NULL, *result = NULL;
    int norder = 0;
    Py_ssize_t rows = 0;
    if (scratch < 0 || shapes == NULL || undecided == NULL || not_steps == NULL) {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(texts, i);
        int nf, is_step;
        int got = scan_text(&sc, item, i, &nf, &is_step, norder, 1);
        if (got < 0) {
            release(vals, nf);
            goto done;
        }
        if (got == 0 || !is_step) {  /* undecided, or another kind of record: decode_record's */
            release(vals, nf);
            PyObject *pos = PyLong_FromSsize_t(i);
            if (pos == NULL || PyList_Append(not_steps, pos) < 0 || (got == 0 && PyList_Append(undecided, pos) < 0)) {
                Py_XDECREF(pos);
                goto done;
            }
            Py_DECREF(pos);
            continue;
        }
        /* Keys in another order than the step record before's (or the first): a new shape. */
        int same = rows > 0 && nf == norder;
        for (int k = 0; same && k < nf; k++)
            same = ents[k] == order[k];
        if (!same) {
            PyObject *keys = PyTuple_New(nf);
            if (keys == NULL) {
                release(vals, nf);
                goto done;
            }
            for (int k = 0; k < nf; k++) {
                Py_INCREF(ents[k]->key);
                PyTuple_SET_ITEM(keys, k, ents[k]->key);
            }
            PyObject *shape = Py_BuildValue("(nN)", rows, keys);
            if (shape == NULL || PyList_Append(shapes, shape) < 0) {
                Py_XDECREF(shape);
                release(vals, nf);
                goto done;
            }
            Py_DECREF(shape);
        }
        for (int k = 0; k < nf; k++) {
            Entry *e = ents[k];
            if (e->column == NULL) {  /* (at most one value per line: n slots hold the column) */
                if ((e->column = PyList_New(n)) == NULL)
                    goto fail_line;
                if ((e->floats = PyMem_Malloc(sizeof(double) * (size_t)(n > 0 ? n : 1))) == NULL) {
                    PyErr_NoMemory();
                    goto fail_line;
                }
            }
            if (e->filled < rows)
                backfill(e, rows);
            PyList_SET_ITEM(e->column, rows, vals[k]);  /* (steals the line's reference) */
            e->last_val = vals[k];
            vals[k] = NULL;
            e->floats[rows] = nums[k];
            e->filled = rows + 1;
            e->mask |= kinds[k];
            e->nonfinite |= kinds[k] == T_FLOAT && !isfinite(nums[k]);
            e->last_tok = toks[k];
            e->last_len = tlens[k];
            e->last_num = nums[k];
            e->last_kind = kinds[k];
            order[k] = e;
        }
        norder = nf;
        rows++;
        continue;
    fail_line:
        for (int k = 0; k < nf; k++)
            Py_XDECREF(vals[k]);
        goto done;
    }
    columns = PyDict_New();
    types = PyDict_New();
    floats = PyDict_New();
    if (columns == NULL || types == NULL || floats == NULL)
        goto done;
    for (Py_ssize_t k = 0; k < t->n; k++) {
        Entry *e = &t->entries[k];
        if (e->column == NULL)
            continue;
        backfill(e, rows);
        PyObject *column = e->column;
        if (e->mask == T_FLOAT) {
            column = Py_None;  /* (every value a float: none made; the float64 column holds them) */
        } else if (e->mask & T_FLOAT) {  /* the floats among other values: made now */
            for (Py_ssize_t r = 0; r < rows; r++) {
                if (PyList_GET_ITEM(column, r) != NULL)
                    continue;
                PyObject *f = PyFloat_FromDouble(e->floats[r]);
                if (f == NULL)
                    goto done;
                PyList_SET_ITEM(column, r, f);
            }
        }
        /* (the slots past the step records are empty: list_ass_slice lets go of NULLs) */
        if ((column != Py_None && PyList_SetSlice(column, rows, n, NULL) < 0) ||
            PyDict_SetItem(columns, e->key, column) < 0)
            goto done;
        PyObject *mask = PyLong_FromLong(e->mask | (e->nonfinite ? T_NONFINITE : 0));
        if (mask == NULL || PyDict_SetItem(types, e->key, mask) < 0) {
            Py_XDECREF(mask);
            goto done;
        }
        Py_DECREF(mask);
        PyObject *raw = PyBytes_FromStringAndSize((const char *)e->floats, (Py_ssize_t)(rows * sizeof(double)));
        if (raw == NULL || PyDict_SetItem(floats, e->key, raw) < 0) {
            Py_XDECREF(raw);
            goto done;
        }
        Py_DECREF(raw);
    }
    result = Py_BuildValue("(OOOOOnO)", shapes, undecided, columns, types, floats, rows, not_steps);
done:
    scratch_free(&sc);
    Py_XDECREF(shapes);
    Py_XDECREF(undecided);
    Py_XDECREF(not_steps);
    Py_XDECREF(columns);
    Py_XDECREF(types);
    Py_XDECREF(floats);
    return result;
}

/* build_records(keys, columns, start, stop): the dicts of rows [start, stop) of a shape (keys, a
 * tuple of str) whose values are columns (a list of lists, one per key, in the keys' order): each
 * a copy of the one before (its key table cloned, no resizing on the way), its values replaced
 * where they differ. steprecords.StepRecords makes a batch's records with it, when read. */
static PyObject *build_records(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *keys, *cols;
    Py_ssize_t start, stop;
    if (!PyArg_ParseTuple(args, "O!O!nn", &PyTuple_Type, &keys, &PyList_Type, &cols, &start, &stop))
        return NULL;
    Py_ssize_t nk = PyTuple_GET_SIZE(keys);
    if (PyList_GET_SIZE(cols) != nk || start < 0 || stop < start) {
        PyErr_SetString(PyExc_ValueError, "build_records: one column per key, 0 <= start <= stop");
        return NULL;
    }
    for (Py_ssize_t k = 0; k < nk; k++) {
        PyObject *c = PyList_GET_ITEM(cols, k);
        if (!PyList_Check(c) || PyList_GET_SIZE(c) < stop) {
            PyErr_SetString(PyExc_ValueError, "build_records: each column a list of at least stop values");
            return NULL;
        }
    }
    PyObject *out = PyList_New(stop - start);
    if (out == NULL)
        return NULL;
    PyObject *prev = NULL;
    for (Py_ssize_t r = start; r < stop; r++) {
        PyObject *rec = prev != NULL ? PyDict_Copy(prev) : PyDict_New();
        if (rec == NULL)
            goto fail;
        for (Py_ssize_t k = 0; k < nk; k++) {
            PyObject *v = PyList_GET_ITEM(PyList_GET_ITEM(cols, k), r);
            if (prev != NULL && v == PyList_GET_ITEM(PyList_GET_ITEM(cols, k), r - 1))
                continue;  /* (the copy holds it already) */
            if (PyDict_SetItem(rec, PyTuple_GET_ITEM(keys, k), v) < 0) {
                Py_DECREF(rec);
                goto fail;
            }
        }
        PyList_SET_ITEM(out, r - start, rec);
        prev = rec;
    }
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

/* scan_records(texts): per line (bytes, or None), the dict of the record it holds when this scanner
 * decides it (a flat record of any kind, by scan_steps' rules: what orjson and the standard
 * library read), else None. For the lines scan_steps leaves to decode_record (records of other
 * kinds), which then only validates the record. */
static PyObject *scan_records(PyObject *self, PyObject *texts) {
    (void)self;
    if (!PyList_Check(texts)) {
        PyErr_SetString(PyExc_TypeError, "scan_records expects a list of bytes");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(texts);
    Scratch sc;
    int scratch = scratch_new(&sc);
    PyObject *out = scratch < 0 ? NULL : PyList_New(n);
    if (out == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_INCREF(Py_None);
        PyList_SET_ITEM(out, i, Py_None);
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(texts, i);
        int nf, is_step;
        int got = scan_text(&sc, item, i, &nf, &is_step, 0, 0);
        if (got <= 0) {
            release(sc.vals, nf);
            if (got < 0) {
                Py_CLEAR(out);
                goto done;
            }
            continue;
        }
        PyObject *rec = PyDict_New();
        for (int k = 0; rec != NULL && k < nf; k++)
            if (PyDict_SetItem(rec, sc.ents[k]->key, sc.vals[k]) < 0)
                Py_CLEAR(rec);
        release(sc.vals, nf);
        if (rec == NULL) {
            Py_CLEAR(out);
            goto done;
        }
        PyList_SetItem(out, i, rec);  /* (steals rec, lets go of the None) */
    }
done:
    scratch_free(&sc);
    return out;
}

/* Whether rows [lo, hi) of v hold a number that is not finite (a MISSING_BITS row holds none). */
static int any_nonfinite(const double *v, Py_ssize_t lo, Py_ssize_t hi) {
    for (Py_ssize_t r = lo; r < hi; r++) {
        unsigned long long bits;
        memcpy(&bits, &v[r], sizeof bits);
        if (bits != MISSING_BITS && !isfinite(v[r]))
            return 1;
    }
    return 0;
}

/* first_nonfinite(columns, start, stop): the first row in [start, stop) where one of the float64
 * columns (buffers, MISSING_BITS where no number; None: skipped) holds a number that is not finite,
 * or -1. parse.py finds a batch's non-finite step records with it, steps.py the whole buckets before
 * the first. */
static PyObject *first_nonfinite(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *cols;
    Py_ssize_t start, stop;
    if (!PyArg_ParseTuple(args, "O!nn", &PyList_Type, &cols, &start, &stop))
        return NULL;
    if (start < 0 || stop < start) {
        PyErr_SetString(PyExc_ValueError, "first_nonfinite: 0 <= start <= stop");
        return NULL;
    }
    Py_ssize_t first = -1;
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(cols); k++) {
        PyObject *col = PyList_GET_ITEM(cols, k);
        if (col == Py_None)
            continue;
        Py_buffer buf;
        if (PyObject_GetBuffer(col, &buf, PyBUF_SIMPLE) < 0)
            return NULL;
        if (buf.len / (Py_ssize_t)sizeof(double) < stop) {
            PyBuffer_Release(&buf);
            PyErr_SetString(PyExc_ValueError, "first_nonfinite: a column is shorter than the rows");
            return NULL;
        }
        const double *v = (const double *)buf.buf;
        for (Py_ssize_t r = start; r < (first < 0 ? stop : first); r++) {
            if (any_nonfinite(v, r, r + 1)) {
                first = r;
                break;
            }
        }
        PyBuffer_Release(&buf);
    }
    return PyLong_FromSsize_t(first);
}

/* Of rows [lo, lo + size) of v (finite numbers, or MISSING_BITS: none), how many hold a number, and
 * the rows of the first, the last, the first smallest and the first largest (at[0..3]; -1: none). */
static Py_ssize_t row_extremes(const double *v, Py_ssize_t lo, Py_ssize_t size, Py_ssize_t at[4]) {
    Py_ssize_t count = 0, first = -1, last = -1, imin = -1, imax = -1;
    for (Py_ssize_t r = lo; r < lo + size; r++) {
        unsigned long long bits;
        memcpy(&bits, &v[r], sizeof bits);
        if (bits == MISSING_BITS)
            continue;
        if (first < 0)
            first = imin = imax = r;
        last = r;
        count++;
        if (v[r] < v[imin])
            imin = r;
        if (v[r] > v[imax])
            imax = r;
    }
    at[0] = first;
    at[1] = last;
    at[2] = imin;
    at[3] = imax;
    return count;
}

/* pyramid.column_summary of rows [lo, lo + size) of v (finite numbers, or MISSING_BITS: none):
 * a new list, or None (a new reference) when none of them holds a number; NULL on an error. */
static PyObject *summarize_rows(const double *v, PyObject *steps, Py_ssize_t lo, Py_ssize_t size) {
    Py_ssize_t at[4];
    Py_ssize_t count = row_extremes(v, lo, size, at);
    if (count == 0)
        Py_RETURN_NONE;
    return Py_BuildValue("[nOdOdOdOd]", count, PyList_GET_ITEM(steps, at[0]), v[at[0]], PyList_GET_ITEM(steps, at[1]),
                         v[at[1]], PyList_GET_ITEM(steps, at[2]), v[at[2]], PyList_GET_ITEM(steps, at[3]), v[at[3]]);
}

/* bucket_summaries(floats, steps, start, buckets, size): pyramid.column_summary of each of
 * `buckets` consecutive buckets of `size` rows from row `start` of a float64 column (a buffer,
 * MISSING_BITS where no number) whose rows' steps are the list `steps`: per bucket None (no
 * number) or [count, first_step, first, last_step, last, min_step, min, max_step, max] over the
 * finite values (the first of the smallest and the first of the largest); or None for the whole
 * call when some value is not finite (the caller's Python path marks those). */
static PyObject *bucket_summaries(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer buf;
    PyObject *steps;
    Py_ssize_t start, buckets, size;
    if (!PyArg_ParseTuple(args, "y*O!nnn", &buf, &PyList_Type, &steps, &start, &buckets, &size))
        return NULL;
    PyObject *out = NULL;
    Py_ssize_t rows = buf.len / (Py_ssize_t)sizeof(double);
    if (start < 0 || buckets < 0 || size <= 0 || start + buckets * size > rows ||
        start + buckets * size > PyList_GET_SIZE(steps)) {
        PyErr_SetString(PyExc_ValueError, "bucket_summaries: rows out of range");
        goto done;
    }
    const double *v = (const double *)buf.buf;
    if (any_nonfinite(v, start, start + buckets * size)) {
        out = Py_None;
        Py_INCREF(out);
        goto done;
    }
    if ((out = PyList_New(buckets)) == NULL)
        goto done;
    for (Py_ssize_t b = 0; b < buckets; b++) {
        PyObject *item = summarize_rows(v, steps, start + b * size, size);
        if (item == NULL) {
            Py_CLEAR(out);
            goto done;
        }
        PyList_SET_ITEM(out, b, item);
    }
done:
    PyBuffer_Release(&buf);
    return out;
}

/* bucket_columns(names, floats, steps, start, buckets, size): bucket_summaries of each name for
 * `buckets` consecutive buckets of `size` rows from row `start`, column-wise as pyramid.Level keeps a
 * level's summaries: per name None (its float64 column, floats[k], is None or holds no number in
 * those rows) or nine bytes objects of a row per bucket, count (uint32), first_step (int64), first
 * (float64), last_step, last, min_step, min, max_step, max; a bucket without a number is a row of
 * zeros. None for the whole call when some column holds a number that is not finite there. */
static PyObject *bucket_columns(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *names, *floats, *steps;
    Py_ssize_t start, buckets, size;
    if (!PyArg_ParseTuple(args, "O!O!O!nnn", &PyList_Type, &names, &PyList_Type, &floats, &PyList_Type, &steps, &start,
                          &buckets, &size))
        return NULL;
    Py_ssize_t nf = PyList_GET_SIZE(names), rows = buckets * size;
    if (PyList_GET_SIZE(floats) != nf || start < 0 || buckets < 0 || size <= 0 ||
        start + rows > PyList_GET_SIZE(steps)) {
        PyErr_SetString(PyExc_ValueError, "bucket_columns: names, floats or rows out of range");
        return NULL;
    }
    Py_buffer *bufs = PyMem_Calloc((size_t)(nf > 0 ? nf : 1), sizeof(Py_buffer));
    long long *at = PyMem_Malloc((size_t)(rows > 0 ? rows : 1) * sizeof(long long));
    Py_ssize_t got = 0;  /* buffers taken: bufs[k] for k < got whose obj is not NULL */
    PyObject *out = NULL;
    if (bufs == NULL || at == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t r = 0; r < rows; r++) {
        at[r] = PyLong_AsLongLong(PyList_GET_ITEM(steps, start + r));
        if (at[r] == -1 && PyErr_Occurred())
            goto done;
    }
    for (; got < nf; got++) {
        PyObject *f = PyList_GET_ITEM(floats, got);
        if (f == Py_None)
            continue;
        if (PyObject_GetBuffer(f, &bufs[got], PyBUF_SIMPLE) < 0)
            goto done;
        if (bufs[got].len / (Py_ssize_t)sizeof(double) < start + rows) {
            PyErr_SetString(PyExc_ValueError, "bucket_columns: a column is shorter than the rows");
            got++;
            goto done;
        }
        if (any_nonfinite((const double *)bufs[got].buf, start, start + rows)) {
            got++;
            out = Py_None;
            Py_INCREF(out);
            goto done;
        }
    }
    if ((out = PyList_New(nf)) == NULL)
        goto done;
    for (Py_ssize_t k = 0; k < nf; k++) {
        PyObject *cols[9] = {NULL};
        Py_ssize_t with = 0;  /* buckets with a number */
        if (bufs[k].obj != NULL) {
            const double *v = (const double *)bufs[k].buf + start;
            for (int c = 0; c < 9; c++)
                if ((cols[c] = PyBytes_FromStringAndSize(NULL, buckets * (c ? 8 : 4))) == NULL)
                    goto fail;
            unsigned int *count = (unsigned int *)PyBytes_AS_STRING(cols[0]);
            long long *ss[4];
            double *vs[4];
            for (int c = 0; c < 4; c++) {
                ss[c] = (long long *)PyBytes_AS_STRING(cols[1 + 2 * c]);
                vs[c] = (double *)PyBytes_AS_STRING(cols[2 + 2 * c]);
            }
            for (Py_ssize_t b = 0; b < buckets; b++) {
                Py_ssize_t pick[4];
                Py_ssize_t n = row_extremes(v, b * size, size, pick);
                count[b] = (unsigned int)n;
                for (int c = 0; c < 4; c++) {
                    ss[c][b] = n ? at[pick[c]] : 0;
                    vs[c][b] = n ? v[pick[c]] : 0.0;
                }
                with += n > 0;
            }
        }
        PyObject *item = Py_None;
        if (with) {
            if ((item = PyList_New(9)) == NULL)
                goto fail;
            for (int c = 0; c < 9; c++) {
                PyList_SET_ITEM(item, c, cols[c]);
                cols[c] = NULL;
            }
        } else {
            Py_INCREF(item);
        }
        for (int c = 0; c < 9; c++)
            Py_XDECREF(cols[c]);
        PyList_SET_ITEM(out, k, item);
        continue;
    fail:
        for (int c = 0; c < 9; c++)
            Py_XDECREF(cols[c]);
        Py_CLEAR(out);
        goto done;
    }
done:
    for (Py_ssize_t k = 0; k < got; k++)
        if (bufs[k].obj != NULL)
            PyBuffer_Release(&bufs[k]);
    PyMem_Free(bufs);
    PyMem_Free(at);
    return out;
}

/* Take a buffer of at least `rows` items of `itemsize` bytes; -1 with an exception set when not. */
static int take_rows(PyObject *obj, Py_buffer *view, Py_ssize_t rows, Py_ssize_t itemsize) {
    if (PyObject_GetBuffer(obj, view, PyBUF_SIMPLE) < 0)
        return -1;
    if (view->len < rows * itemsize) {
        PyBuffer_Release(view);  /* (which sets view->obj to NULL: not released again) */
        PyErr_SetString(PyExc_ValueError, "merge_groups: a column is shorter than the rows");
        return -1;
    }
    return 0;
}

/* merge_groups(base, fields, start, groups, fanout): pyramid.merge_summaries of each of `groups`
 * consecutive groups of `fanout` summaries from row `start` of a level's columns, in the same
 * layouts: base is [lo, hi, n, offset] (int64, int64, uint32, int64), fields a list of a field's
 * nine columns (bucket_columns'). Returns (base, fields) of bytes objects of a row per group: the
 * smallest lo, the largest hi, the sum of n, the first offset; per field the counts summed, the
 * first and last value of the first and last part with a count, the first smallest minimum and the
 * first largest maximum; a row of zeros where no part has a count. */
static PyObject *merge_groups(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *base, *fields;
    Py_ssize_t start, groups, fanout;
    if (!PyArg_ParseTuple(args, "O!O!nnn", &PyList_Type, &base, &PyList_Type, &fields, &start, &groups, &fanout))
        return NULL;
    Py_ssize_t nf = PyList_GET_SIZE(fields), rows = start + groups * fanout;
    if (PyList_GET_SIZE(base) != 4 || start < 0 || groups < 0 || fanout <= 0) {
        PyErr_SetString(PyExc_ValueError, "merge_groups: bad arguments");
        return NULL;
    }
    Py_ssize_t nviews = 4 + 9 * nf;
    Py_buffer *views = PyMem_Calloc((size_t)nviews, sizeof(Py_buffer));
    PyObject *outs = NULL, *result = NULL;
    if (views == NULL)
        return PyErr_NoMemory();
    for (Py_ssize_t k = 0; k < nf; k++) {
        PyObject *cols = PyList_GET_ITEM(fields, k);
        if (!PyList_Check(cols) || PyList_GET_SIZE(cols) != 9) {
            PyErr_SetString(PyExc_ValueError, "merge_groups: a field is not a list of nine columns");
            goto done;
        }
    }
    for (Py_ssize_t i = 0; i < nviews; i++) {
        PyObject *obj = i < 4 ? PyList_GET_ITEM(base, i) : PyList_GET_ITEM(PyList_GET_ITEM(fields, (i - 4) / 9), (i - 4) % 9);
        Py_ssize_t c = i < 4 ? (i == 2 ? 0 : 1) : (i - 4) % 9;  /* (4-byte columns: n and counts) */
        if (take_rows(obj, &views[i], rows, c ? 8 : 4) < 0)
            goto done;
    }
    if ((outs = PyList_New(nviews)) == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < nviews; i++) {
        Py_ssize_t wide = i < 4 ? i != 2 : (i - 4) % 9 != 0;
        PyObject *b = PyBytes_FromStringAndSize(NULL, groups * (wide ? 8 : 4));
        if (b == NULL)
            goto done;
        PyList_SET_ITEM(outs, i, b);
    }
#define COL(list, i, type) ((type *)PyBytes_AS_STRING(PyList_GET_ITEM(list, i)))
    {
        const long long *lo = views[0].buf, *hi = views[1].buf, *off = views[3].buf;
        const unsigned int *n = views[2].buf;
        for (Py_ssize_t g = 0; g < groups; g++) {
            Py_ssize_t a = start + g * fanout;
            long long l = lo[a], h = hi[a];
            unsigned long long sum = 0;
            for (Py_ssize_t r = a; r < a + fanout; r++) {
                l = lo[r] < l ? lo[r] : l;
                h = hi[r] > h ? hi[r] : h;
                sum += n[r];
            }
            COL(outs, 0, long long)[g] = l;
            COL(outs, 1, long long)[g] = h;
            COL(outs, 2, unsigned int)[g] = (unsigned int)sum;
            COL(outs, 3, long long)[g] = off[a];
        }
    }
    for (Py_ssize_t k = 0; k < nf; k++) {
        Py_buffer *f = &views[4 + 9 * k];
        const unsigned int *count = f[0].buf;
        const long long *fs = f[1].buf, *ls = f[3].buf, *ns = f[5].buf, *xs = f[7].buf;
        const double *fv = f[2].buf, *lv = f[4].buf, *nv = f[6].buf, *xv = f[8].buf;
        Py_ssize_t o = 4 + 9 * k;
        for (Py_ssize_t g = 0; g < groups; g++) {
            Py_ssize_t a = start + g * fanout, first = -1, last = -1, imin = -1, imax = -1;
            unsigned long long sum = 0;
            for (Py_ssize_t r = a; r < a + fanout; r++) {
                if (count[r] == 0)
                    continue;
                sum += count[r];
                if (first < 0)
                    first = imin = imax = r;
                last = r;
                if (nv[r] < nv[imin])
                    imin = r;
                if (xv[r] > xv[imax])
                    imax = r;
            }
            int has = first >= 0;
            COL(outs, o, unsigned int)[g] = (unsigned int)sum;
            COL(outs, o + 1, long long)[g] = has ? fs[first] : 0;
            COL(outs, o + 2, double)[g] = has ? fv[first] : 0.0;
            COL(outs, o + 3, long long)[g] = has ? ls[last] : 0;
            COL(outs, o + 4, double)[g] = has ? lv[last] : 0.0;
            COL(outs, o + 5, long long)[g] = has ? ns[imin] : 0;
            COL(outs, o + 6, double)[g] = has ? nv[imin] : 0.0;
            COL(outs, o + 7, long long)[g] = has ? xs[imax] : 0;
            COL(outs, o + 8, double)[g] = has ? xv[imax] : 0.0;
        }
    }
#undef COL
    {
        PyObject *merged_base = PyList_GetSlice(outs, 0, 4);
        PyObject *merged_fields = PyList_New(nf);
        if (merged_base != NULL && merged_fields != NULL) {
            for (Py_ssize_t k = 0; k < nf; k++) {
                PyObject *cols = PyList_GetSlice(outs, 4 + 9 * k, 13 + 9 * k);
                if (cols == NULL) {
                    Py_CLEAR(merged_fields);
                    break;
                }
                PyList_SET_ITEM(merged_fields, k, cols);
            }
        }
        if (merged_base != NULL && merged_fields != NULL)
            result = Py_BuildValue("(NN)", merged_base, merged_fields);
        else {
            Py_XDECREF(merged_base);
            Py_XDECREF(merged_fields);
        }
    }
done:
    for (Py_ssize_t i = 0; i < nviews; i++)
        if (views[i].obj != NULL)
            PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    Py_XDECREF(outs);
    return result;
}

/* Append the int i to list out: 0, or -1 with an exception set. */
static int append_index(PyObject *out, Py_ssize_t i) {
    PyObject *item = PyLong_FromSsize_t(i);
    if (item == NULL)
        return -1;
    int rc = PyList_Append(out, item);
    Py_DECREF(item);
    return rc;
}

/* m4_indices(floats, buckets): downsample.downsample_indices of the float64 rows of a buffer
 * (relative positions, ascending): per bucket of consecutive rows (bucket_bounds), the first, the
 * last, the first smallest and the first largest finite value, and every value that is not finite;
 * every row when there are no more than 4 * buckets. None when a row is MISSING_BITS (no number:
 * the caller leaves those rows out, which changes the buckets: its Python path does that). */
static PyObject *m4_indices(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer buf;
    Py_ssize_t buckets;
    if (!PyArg_ParseTuple(args, "y*n", &buf, &buckets))
        return NULL;
    PyObject *out = NULL;
    const double *v = (const double *)buf.buf;
    Py_ssize_t n = buf.len / (Py_ssize_t)sizeof(double);
    if (buckets < 1)
        buckets = 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned long long bits;
        memcpy(&bits, &v[i], sizeof bits);
        if (bits == MISSING_BITS) {
            out = Py_None;
            Py_INCREF(out);
            goto done;
        }
    }
    if (n <= 4 * buckets) { /* every row */
        if ((out = PyList_New(n)) == NULL)
            goto done;
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *item = PyLong_FromSsize_t(i);
            if (item == NULL)
                goto fail;
            PyList_SET_ITEM(out, i, item);
        }
        goto done;
    }
    if ((out = PyList_New(0)) == NULL)
        goto done;
    for (Py_ssize_t b = 0; b < buckets; b++) {
        /* bucket_bounds: [n * b // buckets, n * (b + 1) // buckets), here with buckets < n */
        Py_ssize_t lo = (Py_ssize_t)((long long)n * b / buckets);
        Py_ssize_t hi = (Py_ssize_t)((long long)n * (b + 1) / buckets);
        Py_ssize_t first = -1, last = -1, imin = -1, imax = -1, odd = 0;
        for (Py_ssize_t i = lo; i < hi; i++) {
            if (!isfinite(v[i])) {
                odd++;
                continue;
            }
            if (first < 0)
                first = imin = imax = i;
            last = i;
            if (v[i] < v[imin])
                imin = i;
            if (v[i] > v[imax])
                imax = i;
        }
        if (odd == 0) { /* the four, sorted and distinct */
            Py_ssize_t k[4] = {first, last, imin, imax};
            for (int x = 1; x < 4; x++)
                for (int y = x; y > 0 && k[y - 1] > k[y]; y--) {
                    Py_ssize_t t = k[y];
                    k[y] = k[y - 1];
                    k[y - 1] = t;
                }
            for (int x = 0; x < 4; x++)
                if ((x == 0 || k[x] != k[x - 1]) && k[x] >= 0 && append_index(out, k[x]) < 0)
                    goto fail;
            continue;
        }
        for (Py_ssize_t i = lo; i < hi; i++) /* in order: the non-finite rows and the four */
            if ((!isfinite(v[i]) || i == first || i == last || i == imin || i == imax) &&
                append_index(out, i) < 0)
                goto fail;
    }
    goto done;
fail:
    Py_CLEAR(out);
done:
    PyBuffer_Release(&buf);
    return out;
}

/* field_points(records, first, nodes): pyramid._extend_points of the buckets ``nodes`` (increasing
 * ints, each >= first) of one field whose levelfiles.FIELD records, from bucket ``first`` on, are
 * the buffer ``records`` (little-endian <qqdqdqdqd: count, first step and value, last, min, max):
 * each counted bucket's distinct (step, value) points of {first, min, max, last} in (step, value)
 * order, as Summary.points gives them. None when a value is NaN (the set's and sort's rules differ
 * from a C comparison there; the summaries hold finite values only) or on a big-endian host. */
static PyObject *field_points(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer buf;
    Py_ssize_t first;
    PyObject *nodes;
    if (!PyArg_ParseTuple(args, "y*nO", &buf, &first, &nodes))
        return NULL;
    PyObject *out = NULL, *seq = NULL;
    const unsigned one = 1;
    if (*(const unsigned char *)&one != 1) { /* big-endian: the caller's Python path */
        out = Py_None;
        Py_INCREF(out);
        goto done;
    }
    if ((seq = PySequence_Fast(nodes, "field_points: nodes must be a sequence")) == NULL)
        goto done;
    const Py_ssize_t size = 72, count = buf.len / size, n = PySequence_Fast_GET_SIZE(seq);
    if ((out = PyList_New(0)) == NULL)
        goto done;
    for (Py_ssize_t j = 0; j < n; j++) {
        Py_ssize_t i = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(seq, j));
        if (i == -1 && PyErr_Occurred())
            goto fail;
        i -= first;
        if (i < 0 || i >= count) {
            PyErr_SetString(PyExc_IndexError, "field_points: a node outside the records");
            goto fail;
        }
        const char *rec = (const char *)buf.buf + i * size;
        long long c, st[4];
        double val[4];
        memcpy(&c, rec, 8);
        if (c == 0)
            continue;
        /* the set literal's order: first (1, 2), min (5, 6), max (7, 8), last (3, 4) */
        static const int at[4] = {1, 5, 7, 3};
        int k = 0;
        for (int x = 0; x < 4; x++) {
            long long s;
            double v;
            memcpy(&s, rec + 8 * at[x], 8);
            memcpy(&v, rec + 8 * (at[x] + 1), 8);
            if (isnan(v)) {
                Py_DECREF(out);
                out = Py_None;
                Py_INCREF(out);
                goto done;
            }
            int dup = 0;
            for (int y = 0; y < k; y++)
                if (st[y] == s && val[y] == v)
                    dup = 1; /* the set keeps the first of equal points (0.0 before -0.0) */
            if (dup)
                continue;
            int y = k++; /* insertion in (step, value) order: distinct points, so one order */
            while (y > 0 && (st[y - 1] > s || (st[y - 1] == s && val[y - 1] > v))) {
                st[y] = st[y - 1];
                val[y] = val[y - 1];
                y--;
            }
            st[y] = s;
            val[y] = v;
        }
        for (int x = 0; x < k; x++) {
            PyObject *point = PyTuple_New(2), *s = NULL, *v = NULL;
            if (point == NULL || (s = PyLong_FromLongLong(st[x])) == NULL ||
                (v = PyFloat_FromDouble(val[x])) == NULL) {
                Py_XDECREF(point);
                Py_XDECREF(s);
                goto fail;
            }
            PyTuple_SET_ITEM(point, 0, s);
            PyTuple_SET_ITEM(point, 1, v);
            if (PyList_Append(out, point) < 0) {
                Py_DECREF(point);
                goto fail;
            }
            Py_DECREF(point);
        }
    }
    goto done;
fail:
    Py_CLEAR(out);
done:
    Py_XDECREF(seq);
    PyBuffer_Release(&buf);
    return out;
}

/* The k-th smallest of v[0..n) (0-based), v reordered (Hoare's selection, median-of-three pivot). */
static double select_kth(double *v, Py_ssize_t n, Py_ssize_t k) {
    Py_ssize_t lo = 0, hi = n - 1;
    while (hi > lo) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        double a = v[lo], b = v[mid], c = v[hi];
        double pivot = a < b ? (b < c ? b : (a < c ? c : a)) : (a < c ? a : (b < c ? c : b));
        Py_ssize_t i = lo, j = hi;
        while (i <= j) {
            while (v[i] < pivot)
                i++;
            while (v[j] > pivot)
                j--;
            if (i <= j) {
                double t = v[i];
                v[i] = v[j];
                v[j] = t;
                i++;
                j--;
            }
        }
        if (k <= j)
            hi = j;
        else if (k >= i)
            lo = i;
        else
            return v[k];
    }
    return v[k];
}

/* Copy the floats of a fast sequence into v from at; 0 when an item is not a float or is a NaN. */
static int fill_floats(PyObject *seq, double *v, Py_ssize_t at) {
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyFloat_CheckExact(items[i]))
            return 0;
        double x = PyFloat_AS_DOUBLE(items[i]);
        if (x != x)
            return 0;
        v[at + i] = x;
    }
    return 1;
}

/* The median of v[0:n] (n > 0, no NaN) as sorted() gives it, into *m; 0 when a selection cannot be
 * sure to give the same (a zero median: sorted keeps 0.0 and -0.0 in their order). v is reordered. */
static int median_of(double *v, Py_ssize_t n, double *m) {
    Py_ssize_t mid = n / 2;
    double x = select_kth(v, n, mid);
    if (n % 2 == 0) {  /* the largest of those below the middle one: the (mid - 1)-th */
        double below = v[0];
        for (Py_ssize_t i = 1; i < mid; i++)
            if (v[i] > below)
                below = v[i];
        x = 0.5 * (below + x);
    }
    *m = x;
    return x != 0.0;
}

/* The floats of one or two sequences, in order, in one buffer (on the stack when few). */
typedef struct {
    double stack[1024];
    double *v;
    Py_ssize_t n;
} Floats;

/* Gather the floats of a and then b (NULL: none) into f: 1, or 0 when an item is not a float or
 * is a NaN, or -1 with an exception set. Free f with floats_free in every case. */
static int gather_floats(Floats *f, PyObject *a, PyObject *b) {
    f->v = f->stack;
    f->n = 0;
    PyObject *sa = PySequence_Fast(a, "expected a sequence of floats");
    if (sa == NULL)
        return -1;
    PyObject *sb = b != NULL ? PySequence_Fast(b, "expected a sequence of floats") : NULL;
    if (b != NULL && sb == NULL) {
        Py_DECREF(sa);
        return -1;
    }
    Py_ssize_t na = PySequence_Fast_GET_SIZE(sa), n = na + (sb != NULL ? PySequence_Fast_GET_SIZE(sb) : 0);
    int ok = 1;
    if (n > (Py_ssize_t)(sizeof(f->stack) / sizeof(double)) &&
        (f->v = PyMem_Malloc(sizeof(double) * (size_t)n)) == NULL) {
        f->v = f->stack;
        PyErr_NoMemory();
        ok = -1;
    }
    if (ok > 0) {
        f->n = n;
        ok = fill_floats(sa, f->v, 0) && (sb == NULL || fill_floats(sb, f->v, na));
    }
    Py_DECREF(sa);
    Py_XDECREF(sb);
    return ok;
}

static void floats_free(Floats *f) {
    if (f->v != f->stack)
        PyMem_Free(f->v);
}

/* What a selection from gathered floats returns: x, None when it could differ from sorted()'s
 * (!ok), NULL when gathering raised (got < 0). */
static PyObject *selected(int got, int ok, double x) {
    if (got < 0)
        return NULL;
    if (!ok)
        Py_RETURN_NONE;
    return PyFloat_FromDouble(x);
}

/* median(values) -> the median of a sequence of floats as sorted() gives it (the middle one, or
 * the mean of the two middle ones), or None when it cannot be sure to give the same: an empty
 * sequence, a value that is not a float, a NaN, or a zero median (sorted keeps 0.0 and -0.0 in
 * their order, which a selection does not). */
static PyObject *median(PyObject *self, PyObject *arg) {
    (void)self;
    Floats f;
    int got = gather_floats(&f, arg, NULL);
    double m = 0.0;
    int ok = got > 0 && f.n > 0 && median_of(f.v, f.n, &m);
    floats_free(&f);
    return selected(got, ok, m);
}

/* order_statistic(k, a, b): the k-th smallest (from 0) of the floats of the sequences a and b
 * together, as sorted(chain(a, b))[k] gives it, or None when it cannot be sure to give the same: k
 * out of range, a value that is not a float, a NaN, or a zero result (sorted keeps 0.0 and -0.0 in
 * their order, which a selection does not). The alarm rule's median ceiling (alarmrule.py). */
static PyObject *order_statistic(PyObject *self, PyObject *args) {
    (void)self;
    Py_ssize_t k;
    PyObject *a, *b;
    if (!PyArg_ParseTuple(args, "nOO", &k, &a, &b))
        return NULL;
    Floats f;
    int got = gather_floats(&f, a, b);
    double x = 0.0;
    int ok = got > 0 && 0 <= k && k < f.n;
    if (ok) {
        x = select_kth(f.v, f.n, k);
        ok = x != 0.0;
    }
    floats_free(&f);
    return selected(got, ok, x);
}

/* window_medians(window, values, cuts, size): for each cut c of cuts (ascending, 0 <= c <=
 * len(values)), the median of the last `size` of the floats of window (a sequence, oldest first)
 * followed by values[:c], as sorted() gives it: a list, or None when a selection cannot be sure to
 * give the same for all of them (a value not a float, a NaN, a zero median, an empty window) or a
 * cut is out of order. The alarm rule's scale samples (alarmrule.py, _extend_sampled): the
 * running medians a stretch of values passes through, without appending them one stretch at a time. */
static PyObject *window_medians(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *w, *vals, *cuts;
    Py_ssize_t size;
    if (!PyArg_ParseTuple(args, "OOO!n", &w, &vals, &PyList_Type, &cuts, &size))
        return NULL;
    if (size <= 0) {
        PyErr_SetString(PyExc_ValueError, "window_medians: size must be > 0");
        return NULL;
    }
    Py_ssize_t nw = PyObject_Length(w);
    if (nw < 0)
        return NULL;
    Floats f;
    int ok = gather_floats(&f, w, vals);
    Py_ssize_t n = f.n, ncuts = PyList_GET_SIZE(cuts);
    double *all = f.v;
    double *scratch = ok > 0 ? PyMem_Malloc(sizeof(double) * (size_t)size) : NULL;
    PyObject *out = NULL;
    if (ok > 0 && scratch == NULL)
        PyErr_NoMemory();
    ok = ok > 0 && scratch != NULL && (out = PyList_New(ncuts)) != NULL;
    Py_ssize_t prev = 0;
    for (Py_ssize_t j = 0; ok && j < ncuts; j++) {
        Py_ssize_t c = PyLong_AsSsize_t(PyList_GET_ITEM(cuts, j));
        if (c == -1 && PyErr_Occurred())
            break;
        ok = c >= prev && nw + c <= n && nw + c > 0;
        prev = c;
        if (!ok)
            break;
        Py_ssize_t end = nw + c, len = end < size ? end : size;
        memcpy(scratch, all + (end - len), sizeof(double) * (size_t)len);
        double m;
        ok = median_of(scratch, len, &m);
        PyObject *value = ok ? PyFloat_FromDouble(m) : NULL;
        if (ok && value == NULL)
            break;
        if (ok)
            PyList_SET_ITEM(out, j, value);
    }
    floats_free(&f);
    PyMem_Free(scratch);
    if (PyErr_Occurred()) {
        Py_XDECREF(out);
        return NULL;
    }
    if (!ok) {
        Py_XDECREF(out);
        Py_RETURN_NONE;
    }
    return out;
}

/* chunk_maxima(floats, lo, hi, chunk): the largest of rows [lo, hi) of a buffer of float64s, per
 * chunk of `chunk` rows from lo (the last one up to hi), as max() of each chunk's values gives it
 * (the first of equal ones: -0.0 before 0.0 stays -0.0). The alarm rule's quiet-chunk screen
 * (alarmrule.py) reads them, for rows that hold finite numbers. */
static PyObject *chunk_maxima(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer buf;
    Py_ssize_t lo, hi, chunk;
    if (!PyArg_ParseTuple(args, "y*nnn", &buf, &lo, &hi, &chunk))
        return NULL;
    if (lo < 0 || hi < lo || chunk < 1 || hi > buf.len / (Py_ssize_t)sizeof(double)) {
        PyBuffer_Release(&buf);
        PyErr_SetString(PyExc_ValueError, "chunk_maxima: rows out of the buffer, or a chunk < 1");
        return NULL;
    }
    const double *v = (const double *)buf.buf;
    PyObject *out = PyList_New((hi - lo + chunk - 1) / chunk);
    for (Py_ssize_t a = lo, k = 0; out != NULL && a < hi; a += chunk, k++) {
        Py_ssize_t b = hi - a < chunk ? hi : a + chunk;
        double top = v[a];
        for (Py_ssize_t i = a + 1; i < b; i++)
            if (v[i] > top)
                top = v[i];
        PyObject *f = PyFloat_FromDouble(top);
        if (f == NULL)
            Py_CLEAR(out);
        else
            PyList_SET_ITEM(out, k, f);
    }
    PyBuffer_Release(&buf);
    return out;
}

/* increasing(floats): whether a buffer of float64s increases strictly (False at a NaN).
 * parse.KeyColumns.increasing reads the scanner's step column with it (integers up to 2^53: each
 * exact, so compared as the ints are). */
static PyObject *increasing(PyObject *self, PyObject *arg) {
    (void)self;
    Py_buffer buf;
    if (PyObject_GetBuffer(arg, &buf, PyBUF_SIMPLE) < 0)
        return NULL;
    const double *v = (const double *)buf.buf;
    Py_ssize_t n = buf.len / (Py_ssize_t)sizeof(double), i = 1;
    while (i < n && v[i - 1] < v[i])
        i++;
    PyBuffer_Release(&buf);
    return PyBool_FromLong(i >= n);
}

/* rows_in(floats, lo, hi): the rows of a buffer of float64s whose value is in [lo, hi] (never a
 * NaN: a row without a number, columns.MISSING_BITS, is none). The alarm rule's zero norms
 * (alarmrule.BatchAlarmRule.update_steps): a batch has none, looked for in one pass. */
static PyObject *rows_in(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer buf;
    double lo, hi;
    if (!PyArg_ParseTuple(args, "y*dd", &buf, &lo, &hi))
        return NULL;
    const double *v = (const double *)buf.buf;
    Py_ssize_t n = buf.len / (Py_ssize_t)sizeof(double);
    PyObject *out = PyList_New(0);
    for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
        if (v[i] >= lo && v[i] <= hi) {
            PyObject *at = PyLong_FromSsize_t(i);
            if (at == NULL || PyList_Append(out, at) < 0)
                Py_CLEAR(out);
            Py_XDECREF(at);
        }
    }
    PyBuffer_Release(&buf);
    return out;
}

/* rows_of_columns(columns, sizes, rows): rows [0, rows) of columns (buffers of 4-byte unsigned or
 * 8-byte items, sizes[i] each) interleaved into rows of 8-byte items, a 4-byte one widened: on a
 * little-endian machine, the bytes struct.pack("<qq...") of each row gives for ints and doubles
 * (levelfiles.LevelFile.append's rows, written at every flush of a pyramid level). */
static PyObject *rows_of_columns(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *columns, *sizes;
    Py_ssize_t rows;
    if (!PyArg_ParseTuple(args, "O!O!n", &PyList_Type, &columns, &PyTuple_Type, &sizes, &rows))
        return NULL;
    Py_ssize_t k = PyList_GET_SIZE(columns);
    if (rows < 0 || k == 0 || k > 16 || PyTuple_GET_SIZE(sizes) != k) {
        PyErr_SetString(PyExc_ValueError, "rows_of_columns: 1 to 16 columns, a size each, rows >= 0");
        return NULL;
    }
    Py_buffer views[16];
    int width[16];
    Py_ssize_t got = 0;
    PyObject *out = NULL;
    for (; got < k; got++) {
        width[got] = (int)PyLong_AsLong(PyTuple_GET_ITEM(sizes, got));
        if (width[got] != 4 && width[got] != 8) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "rows_of_columns: an item size is 4 or 8");
            goto done;
        }
        if (PyObject_GetBuffer(PyList_GET_ITEM(columns, got), &views[got], PyBUF_SIMPLE) < 0)
            goto done;
        if (views[got].len < rows * width[got]) {
            got++;
            PyErr_SetString(PyExc_ValueError, "rows_of_columns: a column is shorter than the rows");
            goto done;
        }
    }
    out = PyBytes_FromStringAndSize(NULL, rows * k * 8);
    if (out == NULL)
        goto done;
    unsigned char *dst = (unsigned char *)PyBytes_AS_STRING(out);
    for (Py_ssize_t r = 0; r < rows; r++) {
        for (Py_ssize_t c = 0; c < k; c++, dst += 8) {
            const unsigned char *src = (const unsigned char *)views[c].buf;
            if (width[c] == 8) {
                memcpy(dst, src + r * 8, 8);
            } else {
                uint32_t v32;
                memcpy(&v32, src + r * 4, 4);
                uint64_t v = v32;
                memcpy(dst, &v, 8);
            }
        }
    }
done:
    for (Py_ssize_t c = 0; c < got; c++)
        PyBuffer_Release(&views[c]);
    return out;
}

/* Whether a line is a step record as gradmon's writer writes it ({"type":"step" first). */
static int step_line(PyObject *line) {
    static const char prefix[] = "{\"type\":\"step\"";
    return PyBytes_Check(line) && PyBytes_GET_SIZE(line) >= (Py_ssize_t)sizeof prefix - 1 &&
           memcmp(PyBytes_AS_STRING(line), prefix, sizeof prefix - 1) == 0;
}

/* bucket_cut(lines, open_records, bucket): how many of lines ((end, line) pairs) to index so that
 * the step records among them fill the open bucket (open_records held) and whole buckets after it:
 * the position after the step line that does; len(lines) when they fill none, or all. Lines count
 * as step records when they start as the writer writes one; a step record written otherwise only
 * leaves a bucket open, which a later slice closes. */
static PyObject *bucket_cut(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *lines;
    Py_ssize_t open_records, bucket;
    if (!PyArg_ParseTuple(args, "O!nn", &PyList_Type, &lines, &open_records, &bucket))
        return NULL;
    if (bucket <= 0 || open_records < 0) {
        PyErr_SetString(PyExc_ValueError, "bucket_cut: bucket must be positive, open_records not negative");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(lines), steps = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *pair = PyList_GET_ITEM(lines, i);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
            PyErr_SetString(PyExc_TypeError, "bucket_cut expects (end, line) pairs");
            return NULL;
        }
        steps += step_line(PyTuple_GET_ITEM(pair, 1));
    }
    Py_ssize_t keep = steps - (open_records + steps) % bucket;  /* step records to index */
    if (keep <= 0 || keep == steps)
        return PyLong_FromSsize_t(n);
    for (Py_ssize_t i = 0; i < n; i++)
        if (step_line(PyTuple_GET_ITEM(PyList_GET_ITEM(lines, i), 1)) && --keep == 0)
            return PyLong_FromSsize_t(i + 1);
    return PyLong_FromSsize_t(n);  /* (not reached) */
}

/* split_lines(data, start, base, max_line): the complete lines of data[start:] (each ending with
 * "\n", a "\r" before it dropped) as (end offset, line) pairs, the end offset being base + the
 * position after the line's "\n"; and the position after the last "\n" (start when none). None
 * when a line is longer than max_line (the caller's own loop skips it). */
static PyObject *split_lines(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer buf;
    Py_ssize_t start, max_line;
    long long base;
    if (!PyArg_ParseTuple(args, "y*nLn", &buf, &start, &base, &max_line))
        return NULL;
    const char *data = (const char *)buf.buf;
    Py_ssize_t len = buf.len;
    PyObject *out = PyList_New(0);
    if (out == NULL || start < 0 || start > len) {
        if (out != NULL)
            PyErr_SetString(PyExc_ValueError, "split_lines: start out of range");
        Py_XDECREF(out);
        PyBuffer_Release(&buf);
        return NULL;
    }
    Py_ssize_t p = start;
    for (;;) {
        const char *nl = memchr(data + p, '\n', (size_t)(len - p));
        if (nl == NULL)
            break;
        Py_ssize_t e = nl - data;
        Py_ssize_t n = e - p;
        if (n > max_line) {
            Py_DECREF(out);
            PyBuffer_Release(&buf);
            Py_RETURN_NONE;
        }
        if (n > 0 && data[e - 1] == '\r')
            n--;
        PyObject *line = PyBytes_FromStringAndSize(data + p, n);
        PyObject *end = line != NULL ? PyLong_FromLongLong(base + e + 1) : NULL;
        PyObject *pair = end != NULL ? PyTuple_New(2) : NULL;
        if (pair == NULL) {
            Py_XDECREF(line);
            Py_XDECREF(end);
            Py_DECREF(out);
            PyBuffer_Release(&buf);
            return NULL;
        }
        PyTuple_SET_ITEM(pair, 0, end);
        PyTuple_SET_ITEM(pair, 1, line);
        if (PyList_Append(out, pair) < 0) {
            Py_DECREF(pair);
            Py_DECREF(out);
            PyBuffer_Release(&buf);
            return NULL;
        }
        Py_DECREF(pair);
        p = e + 1;
    }
    PyBuffer_Release(&buf);
    return Py_BuildValue("(Nn)", out, p);
}

/* text_keys(keys): the keys (a frozenset of str) whose values decode_record keeps as text
 * (schema.TEXT_KEYS); the scanners read a "NaN", "Infinity" or "-Infinity" value of any other key
 * as decode_record's float. native.py gives them when it loads the module. */
static PyObject *text_keys(PyObject *self, PyObject *keys) {
    (void)self;
    if (!PyFrozenSet_Check(keys)) {
        PyErr_SetString(PyExc_TypeError, "text_keys expects a frozenset of str");
        return NULL;
    }
    Py_INCREF(keys);
    Py_XSETREF(TEXT_KEYS, keys);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"bucket_columns", bucket_columns, METH_VARARGS,
     "bucket_columns(names, floats, steps, start, buckets, size) -> [nine columns or None per name] or None"},
    {"merge_groups", merge_groups, METH_VARARGS,
     "merge_groups(base, fields, start, groups, fanout) -> (base, fields) of the merged groups' rows"},
    {"bucket_summaries", bucket_summaries, METH_VARARGS,
     "bucket_summaries(floats, steps, start, buckets, size) -> [summary or None per bucket] or None"},
    {"field_points", field_points, METH_VARARGS,
     "field_points(records, first, nodes) -> [(step, value)] of the buckets' summaries, or None"},
    {"m4_indices", m4_indices, METH_VARARGS,
     "m4_indices(floats, buckets) -> [row positions kept] or None (a row without a number)"},
    {"bucket_cut", bucket_cut, METH_VARARGS,
     "bucket_cut(lines, open_records, bucket) -> how many lines fill the open bucket and whole buckets"},
    {"median", median, METH_O, "median(values) -> the median of floats as sorted() gives it, or None"},
    {"window_medians", window_medians, METH_VARARGS,
     "window_medians(window, values, cuts, size) -> [the running median at each cut], or None"},
    {"order_statistic", order_statistic, METH_VARARGS,
     "order_statistic(k, a, b) -> sorted(chain(a, b))[k] of floats, or None"},
    {"chunk_maxima", chunk_maxima, METH_VARARGS,
     "chunk_maxima(floats, lo, hi, chunk) -> [the largest float64 of each chunk of rows [lo, hi)]"},
    {"first_nonfinite", first_nonfinite, METH_VARARGS,
     "first_nonfinite(columns, start, stop) -> the first row with a number that is not finite, or -1"},
    {"text_keys", text_keys, METH_O,
     "text_keys(keys) -> None; the keys (a frozenset) whose \"NaN\" strings are text, not floats"},
    {"increasing", increasing, METH_O, "increasing(floats) -> whether the float64s increase strictly"},
    {"rows_in", rows_in, METH_VARARGS, "rows_in(floats, lo, hi) -> [the rows whose float64 is in [lo, hi]]"},
    {"rows_of_columns", rows_of_columns, METH_VARARGS,
     "rows_of_columns(columns, sizes, rows) -> the rows of 8-byte items (4-byte ones widened), as bytes"},
    {"split_lines", split_lines, METH_VARARGS,
     "split_lines(data, start, base, max_line) -> ([(end, line)], position after the last newline) or None"},
    {"scan_records", scan_records, METH_O, "scan_records(texts) -> [the dict of each line it decides, else None]"},
    {"scan_steps", scan_steps, METH_O, "scan_steps(texts) -> (shapes, undecided, columns, types, floats, rows, not_steps)"},
    {"build_records", build_records, METH_VARARGS,
     "build_records(keys, columns, start, stop) -> [the dict of each row of a shape]"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_scanlines", NULL, -1, methods};

PyMODINIT_FUNC PyInit__scanlines(void) {
    STEP = PyUnicode_InternFromString("step");
    if (STEP == NULL)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddObject(m, "MISSING_BITS", PyLong_FromUnsignedLongLong(MISSING_BITS)) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
