/* A machine whose boot costs about a millisecond of CPU, for benchmarks that should
 * measure the platform rather than the interpreter start-up of a Python app.
 *
 * Listens on 0.0.0.0:$PORT and answers every request with 200 and "tiny <$THAW_MACHINE_ID>\n".
 * HTTP/1.1 keep-alive and pipelining over up to MAX_CONNS connections, one poll() loop;
 * a request head is read up to CRLFCRLF (at most HEAD_MAX bytes, else 400 and close)
 * and a Content-Length body is skipped. A chunked body cannot be skipped without parsing
 * it, so such a request is answered and its connection closed. SIGTERM exits 0.
 *
 *     gcc -O2 -Wall -Wextra -o tinyhttp tinyhttp.c
 */
#define _GNU_SOURCE /* memmem, accept4 */
#include <ctype.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAX_CONNS 256
#define HEAD_MAX 16384

struct conn {
    size_t len;         /* bytes held in buf */
    uint64_t skip;      /* body bytes of the last request still to discard */
    char buf[HEAD_MAX];
};

static struct pollfd fds[1 + MAX_CONNS]; /* fds[0] is the listener */
static struct conn conns[1 + MAX_CONNS];
static int nfds = 1;
static char reply[2][256]; /* [1] also says Connection: close */
static int reply_len[2];
static const char bad_request[] =
    "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";

static void on_term(int sig) {
    (void)sig;
    _exit(0);
}

/* The value of header `name` in head[0, len) (a CRLF after each line), or NULL. */
static const char *header(const char *head, size_t len, const char *name, size_t *value_len) {
    size_t n = strlen(name);
    const char *end = head + len, *line = memchr(head, '\n', len); /* skip the request line */
    while (line && ++line < end) {
        const char *eol = memchr(line, '\r', (size_t)(end - line));
        if (!eol || eol == line)
            return NULL;
        if ((size_t)(eol - line) > n && line[n] == ':' && strncasecmp(line, name, n) == 0) {
            const char *v = line + n + 1, *v_end = eol;
            while (v < v_end && (*v == ' ' || *v == '\t'))
                v++;
            while (v_end > v && (v_end[-1] == ' ' || v_end[-1] == '\t'))
                v_end--;
            *value_len = (size_t)(v_end - v);
            return v;
        }
        line = memchr(eol, '\n', (size_t)(end - eol));
    }
    return NULL;
}

static int send_all(int fd, const char *data, size_t len) {
    /* Replies are small: a socket buffer too full to take one means the client is not
     * reading, and the connection is dropped rather than buffered for. */
    return send(fd, data, len, MSG_NOSIGNAL) == (ssize_t)len ? 0 : -1;
}

/* Answer the requests whose heads are complete in c->buf; -1 means close the connection. */
static int serve(int fd, struct conn *c) {
    for (;;) {
        size_t drop = c->skip < c->len ? (size_t)c->skip : c->len;
        memmove(c->buf, c->buf + drop, c->len - drop);
        c->len -= drop;
        c->skip -= drop;
        if (c->skip > 0 || c->len == 0)
            return 0;
        char *eoh = memmem(c->buf, c->len, "\r\n\r\n", 4);
        if (!eoh) {
            if (c->len < HEAD_MAX)
                return 0;
            send_all(fd, bad_request, sizeof bad_request - 1);
            return -1;
        }
        size_t head_len = (size_t)(eoh - c->buf) + 4, vlen;
        const char *v = header(c->buf, head_len, "content-length", &vlen);
        char *stop = NULL;
        uint64_t body = v ? strtoull(v, &stop, 10) : 0;
        if (v && (vlen == 0 || !isdigit((unsigned char)*v) || stop != v + vlen ||
                  body > UINT64_MAX / 2)) { /* head_len + body must not wrap */
            send_all(fd, bad_request, sizeof bad_request - 1);
            return -1;
        }
        int last = header(c->buf, head_len, "transfer-encoding", &vlen) != NULL ||
                   ((v = header(c->buf, head_len, "connection", &vlen)) && vlen == 5 &&
                    strncasecmp(v, "close", 5) == 0);
        if (send_all(fd, reply[last], (size_t)reply_len[last]) < 0 || last)
            return -1;
        c->skip = head_len + body;
    }
}

static void drop_conn(int i) {
    close(fds[i].fd);
    nfds--;
    if (i != nfds) {
        fds[i] = fds[nfds];
        memcpy(&conns[i], &conns[nfds], sizeof conns[i]);
    }
}

static void accept_all(void) {
    while (nfds < 1 + MAX_CONNS) {
        int fd = accept4(fds[0].fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0)
            return;
        fds[nfds] = (struct pollfd){.fd = fd, .events = POLLIN};
        conns[nfds].len = 0;
        conns[nfds].skip = 0;
        nfds++;
    }
}

static void on_readable(int i) {
    struct conn *c = &conns[i];
    ssize_t got = recv(fds[i].fd, c->buf + c->len, HEAD_MAX - c->len, 0);
    if (got < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    if (got <= 0) {
        drop_conn(i);
        return;
    }
    c->len += (size_t)got;
    if (serve(fds[i].fd, c) < 0)
        drop_conn(i);
}

int main(void) {
    const char *port = getenv("PORT"), *id = getenv("THAW_MACHINE_ID");
    if (!port) {
        fprintf(stderr, "tinyhttp: PORT is not set\n");
        return 2;
    }
    char body[160];
    int body_len = snprintf(body, sizeof body, "tiny %.128s\n", id ? id : "?");
    for (int last = 0; last < 2; last++)
        reply_len[last] = snprintf(reply[last], sizeof reply[last],
                                   "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                                   "Content-Length: %d\r\n%s\r\n%s",
                                   body_len, last ? "Connection: close\r\n" : "", body);
    signal(SIGTERM, on_term);

    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), one = 1;
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(port)),
                               .sin_addr.s_addr = htonl(INADDR_ANY)};
    if (lfd < 0 || setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0 || bind(lfd, (struct sockaddr *)&addr, sizeof addr) < 0 || listen(lfd, 1024) < 0) {
        perror("tinyhttp: listen");
        return 1;
    }
    fds[0] = (struct pollfd){.fd = lfd, .events = POLLIN};

    for (;;) {
        /* At MAX_CONNS, new connections wait in the backlog until one closes. */
        fds[0].events = nfds < 1 + MAX_CONNS ? POLLIN : 0;
        if (poll(fds, (nfds_t)nfds, -1) < 0) {
            if (errno == EINTR)
                continue;
            perror("tinyhttp: poll");
            return 1;
        }
        /* Backwards, so that a closed connection's slot is refilled from one already seen. */
        for (int i = nfds - 1; i >= 1; i--)
            if (fds[i].revents & (POLLIN | POLLHUP | POLLERR))
                on_readable(i);
        if (fds[0].revents & POLLIN)
            accept_all();
    }
}
