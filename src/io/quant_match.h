/* A quantization config's exclusion list (qd_quant_config: excluded, blocks, match; config.h),
 * ready to answer "is this module left unquantized?" for every module of a load.
 *
 * The "re:" entries are compiled once, when the matcher is made: a checkpoint of tens of
 * thousands of expert modules checked against dozens of entries would otherwise spend
 * tens of seconds in regcomp. qd_quant_config is a plain value, copied by value, so the
 * compiled patterns live here instead, in an object with an owner; the matcher keeps its
 * own copy of the entries and does not refer to the config after it is made. */
#ifndef QD_IO_QUANT_MATCH_H
#define QD_IO_QUANT_MATCH_H

#include <stdbool.h>

#include "base/err.h"
#include "io/config.h"

typedef struct qd_quant_matcher qd_quant_matcher;

/* Whether the body of a "re:" entry (the text after "re:") can be used as one. */
typedef enum qd_quant_regex_verdict {
    QD_QUANT_REGEX_OK = 0,
    /* stacked repetitions, more than two intervals, bounds past 16 or over 1000 bytes: glibc's
     * regcomp copies a subtree per bound and per stacked repetition, so a short hostile
     * pattern takes gigabytes to compile */
    QD_QUANT_REGEX_UNTAME,
    /* not a POSIX extended regular expression as written, or not once anchored as it is
     * matched ("^(pattern)": a back-reference then names another group) */
    QD_QUANT_REGEX_INVALID,
    QD_QUANT_REGEX_NO_MEMORY
} qd_quant_regex_verdict;

/* The verdict on one pattern; the config parser refuses an entry by it, so every list it
 * accepts compiles into a matcher. */
qd_quant_regex_verdict qd_quant_regex_check(const char *pattern);

/* The error for a verdict other than QD_QUANT_REGEX_OK (QD_OK for that one), `entry` naming
 * the pattern's place in the config. */
qd_status qd_quant_regex_error(qd_quant_regex_verdict v, const char *entry, qd_err *err);

/* A matcher of q's exclusions, each "re:" entry compiled once. Fails, naming the entry,
 * where a pattern is not one qd_quant_regex_check accepts (a config the parser did not
 * make), and on running out of memory. Free with qd_quant_matcher_free. */
qd_status qd_quant_matcher_create(const qd_quant_config *q, qd_quant_matcher **out, qd_err *err);

/* Whether the module `name` (a tensor name without ".weight") is left unquantized: outside
 * every block of the config's block list (when it has one), or matched by an entry: a "re:"
 * entry matched from the start of the name (Python's re.match), any other as q->match says
 * (a substring; a name, also as the last components of a longer one; a wildcard, or a
 * name as before). */
bool qd_quant_matcher_excluded(const qd_quant_matcher *mt, const char *name);

void qd_quant_matcher_free(qd_quant_matcher *mt);

#endif
