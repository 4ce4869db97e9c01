// What one GSO train costs the sender, by how its packets are laid out: one `sendmsg` with
// `UDP_SEGMENT` of N packets of SEG bytes, from one iovec per packet (as the runtime's
// `Tx::flush_train` sends today: each packet in its own buffer) against one iovec over
// N * SEG contiguous bytes, alternating rounds of both in one run. A receiving socket on the
// same address (`UDP_GRO`) drains the trains. Measured to size the "train in one buffer"
// idea in session 18's note.
//
//   gcc -O2 -o /tmp/gso-iovec scripts/gso-iovec.c && /tmp/gso-iovec [N] [SEG] [TRAINS]
//   (defaults: 60 packets of 1088 bytes, 50 000 trains per round, 3 rounds)
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif
#define MAX_PACKETS 64

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

// Send `trains` trains; returns the mean time in sendmsg, in microseconds.
static double run(int s, int r, struct sockaddr_in *to, char **bufs, char *flat, int n,
                  int seg, int contiguous, int trains) {
    struct iovec iov[MAX_PACKETS];
    static char sink[1 << 17];
    double in_send = 0;
    for (int k = 0; k < trains; k++) {
        int count;
        if (contiguous) {
            iov[0].iov_base = flat;
            iov[0].iov_len = (size_t)n * (size_t)seg;
            count = 1;
        } else {
            for (int i = 0; i < n; i++) {
                iov[i].iov_base = bufs[i];
                iov[i].iov_len = (size_t)seg;
            }
            count = n;
        }
        char control[CMSG_SPACE(sizeof(unsigned short))];
        memset(control, 0, sizeof control);
        struct msghdr m = {
            .msg_name = to,
            .msg_namelen = sizeof *to,
            .msg_iov = iov,
            .msg_iovlen = (size_t)count,
            .msg_control = control,
            .msg_controllen = sizeof control,
        };
        struct cmsghdr *c = CMSG_FIRSTHDR(&m);
        c->cmsg_level = SOL_UDP;
        c->cmsg_type = UDP_SEGMENT;
        c->cmsg_len = CMSG_LEN(sizeof(unsigned short));
        unsigned short size = (unsigned short)seg;
        memcpy(CMSG_DATA(c), &size, sizeof size);
        double t0 = now();
        if (sendmsg(s, &m, 0) < 0) {
            perror("sendmsg (UDP_SEGMENT)");
            exit(1);
        }
        in_send += now() - t0;
        while (recv(r, sink, sizeof sink, MSG_DONTWAIT) > 0) {
        }
    }
    return in_send / trains * 1e6;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 60;
    int seg = argc > 2 ? atoi(argv[2]) : 1088;
    int trains = argc > 3 ? atoi(argv[3]) : 50000;
    if (n < 2 || n > MAX_PACKETS || seg < 64 || seg > 8192 || trains < 1 ||
        (long)n * seg > 65507) {
        fprintf(stderr, "usage: gso-iovec [N 2..64] [SEG 64..8192, N*SEG <= 65507] [TRAINS]\n");
        return 2;
    }
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons(45999)};
    inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
    int r = socket(AF_INET, SOCK_DGRAM, 0);
    int one = 1, big = 64 << 20;
    if (r < 0 || bind(r, (struct sockaddr *)&to, sizeof to) < 0) {
        perror("receiving socket on 127.0.0.1:45999");
        return 1;
    }
    setsockopt(r, SOL_UDP, UDP_GRO, &one, sizeof one);
    setsockopt(r, SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
    int s = socket(AF_INET, SOCK_DGRAM, 0);
    char *bufs[MAX_PACKETS];
    for (int i = 0; i < n; i++) {
        bufs[i] = malloc((size_t)seg + 128);
        memset(bufs[i], i, (size_t)seg + 128);
    }
    char *flat = malloc((size_t)n * (size_t)seg);
    memset(flat, 1, (size_t)n * (size_t)seg);
    printf("%d packets of %d B per train, %d trains per round\n", n, seg, trains);
    printf("round  per-packet iovecs us  one iovec us  ratio\n");
    for (int round = 1; round <= 3; round++) {
        double split = run(s, r, &to, bufs, flat, n, seg, 0, trains);
        double whole = run(s, r, &to, bufs, flat, n, seg, 1, trains);
        printf("%5d  %20.2f  %12.2f  %5.2fx\n", round, split, whole, split / whole);
    }
    return 0;
}
