/* The server's reasoning split (src/server/think.c; the server's sources are part of
 * the qdelta executable, not the library, so think.c and util.c are compiled in
 * here): tags found across any split of the text into pieces, held-back bytes
 * released at the end, prompt-opened thinking, and a random-split property test. */
#include <string.h>

#include "qd_test.h"
#include "server/think.c"
#include "server/util.c"

typedef struct sink {
    char out[2][512];
    size_t n[2];
    int calls;
} sink;

static void emit(void *user, int r, const char *t, size_t n) {
    sink *s = user;
    memcpy(s->out[r] + s->n[r], t, n);
    s->n[r] += n;
    s->out[r][s->n[r]] = '\0';
    s->calls++;
}

/* Runs text through the splitter cut at the given piece lengths (0-terminated). */
static void run(const char *text, const int *cuts, int opened, sink *s) {
    memset(s, 0, sizeof *s);
    srv_think t = {.enabled = 1, .in_think = opened, .saw_tag = opened};
    size_t off = 0, len = strlen(text);
    for (int i = 0; cuts && cuts[i] && off < len; i++) {
        size_t k = (size_t)cuts[i] < len - off ? (size_t)cuts[i] : len - off;
        srv_think_push(&t, text + off, k, 0, emit, s);
        off += k;
    }
    srv_think_push(&t, text + off, len - off, 0, emit, s);
    srv_think_push(&t, "", 0, 1, emit, s);
    srv_think_free(&t);
}

static void expect(const char *text, int opened, const char *reasoning, const char *content) {
    /* whole, then one byte at a time, then pieces of 3 */
    static const int ones[] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                               1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0};
    static const int threes[] = {3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 0};
    const int *splits[] = {NULL, ones, threes};
    for (int k = 0; k < 3; k++) {
        sink s;
        run(text, splits[k], opened, &s);
        CHECKF(!strcmp(s.out[1], reasoning), "'%s' split %d: reasoning '%s' != '%s'", text, k, s.out[1], reasoning);
        CHECKF(!strcmp(s.out[0], content), "'%s' split %d: content '%s' != '%s'", text, k, s.out[0], content);
    }
}

int main(void) {
    expect("plain answer", 0, "", "plain answer");
    expect("<think>hmm, let me see</think>\n\nThe answer is 4.", 0, "hmm, let me see", "\n\nThe answer is 4.");
    expect("still thinking</think>done", 1, "still thinking", "done");
    expect("thinking with no end", 1, "thinking with no end", "");
    expect("a < b and <thin ice", 0, "", "a < b and <thin ice");          /* near-tags are text */
    expect("<think>x</thin", 0, "x</thin", "");                           /* held back, released at the end */
    expect("<think></think>", 0, "", "");
    expect("pre<think>r1</think>mid<think>r2</think>end", 0, "r1r2", "premidend");

    /* property: any split gives the same result as the whole text */
    qd_test_rng rng = qd_test_rng_from_env();
    static const char *atoms[] = {"<think>", "</think>", "<", "</", "think", ">", "a", " ", "<th", "k>"};
    for (int it = 0; it < 2000; it++) {
        char text[256] = "";
        int na = 1 + (int)(qd_test_next(&rng) % 12);
        for (int i = 0; i < na; i++) strcat(text, atoms[qd_test_next(&rng) % 10]);
        int cuts[64], nc = 0;
        while (nc < 63) cuts[nc++] = 1 + (int)(qd_test_next(&rng) % 5);
        cuts[nc] = 0;
        int opened = (int)(qd_test_next(&rng) & 1);
        sink whole, split;
        run(text, NULL, opened, &whole);
        run(text, cuts, opened, &split);
        CHECKF(!strcmp(whole.out[0], split.out[0]) && !strcmp(whole.out[1], split.out[1]), "random split of '%s'", text);
    }
    return qd_test_finish("test_server_think");
}
