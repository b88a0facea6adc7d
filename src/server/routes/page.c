/* GET /: the chat page. The page is a static file in the repository
 * (src/server/web/chat.html: HTML, CSS and JS, no network resources) compiled into
 * the binary at build time (cmake/embed_file.cmake), so the server needs nothing
 * beside itself to show it. It talks to /v1/chat/completions and /v1/models. */
#include <stdlib.h>
#include <string.h>

#include "server/server.h"

extern const unsigned char qd_chat_html[];
extern const unsigned long qd_chat_html_len;

void srv_route_page(srv_server *s, srv_reply *r) {
    (void)s;
    r->body = malloc(qd_chat_html_len + 1);
    if (r->body) memcpy(r->body, qd_chat_html, qd_chat_html_len + 1);
    r->status = 200;
    r->content_type = "text/html; charset=utf-8";
}
