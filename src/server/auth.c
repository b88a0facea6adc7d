/* Key check for --api-key: OpenAI clients send "Authorization: Bearer KEY", Anthropic
 * clients "x-api-key: KEY". */
#include <string.h>
#include <strings.h>

#include "server/server.h"

/* Compares in time independent of where the strings differ, so response timing
 * does not leak how much of a guessed key was right. */
static int const_time_eq(const char *a, size_t na, const char *b, size_t nb) {
    unsigned diff = (unsigned)(na ^ nb);
    for (size_t i = 0; i < na; i++) diff |= (unsigned char)a[i] ^ (unsigned char)b[i % (nb ? nb : 1)];
    return diff == 0 && nb > 0;
}

int srv_auth_ok(const srv_server *s, const char *h) {
    if (!s->cfg.api_key || !s->cfg.api_key[0]) return 1;
    if (!h) return 0;
    while (*h == ' ') h++;
    if (strncasecmp(h, "Bearer ", 7) != 0) return 0;
    h += 7;
    while (*h == ' ') h++;
    size_t n = strlen(h);
    while (n && (h[n - 1] == ' ' || h[n - 1] == '\t')) n--;
    return const_time_eq(h, n, s->cfg.api_key, strlen(s->cfg.api_key));
}

int srv_auth_key_ok(const srv_server *s, const char *h) {
    if (!s->cfg.api_key || !s->cfg.api_key[0]) return 1;
    if (!h) return 0;
    while (*h == ' ') h++;
    size_t n = strlen(h);
    while (n && (h[n - 1] == ' ' || h[n - 1] == '\t')) n--;
    return const_time_eq(h, n, s->cfg.api_key, strlen(s->cfg.api_key));
}
