/*
 * An MPI ping-pong and an allreduce, for running OpenMPI over softrdma:
 *
 *   mpi_pingpong [MAX_BYTES]
 *
 * Ranks 0 and 1 bounce messages of 1 byte to MAX_BYTES (default 1 MiB, ×16 each step);
 * rank 0 prints one row per size: half the round-trip time and the bandwidth it gives
 * ("bytes usec MB/s"). Every rank checks each message it receives byte for byte. Then all
 * ranks sum their rank numbers plus one with MPI_Allreduce and check the result; rank 0
 * prints "allreduce N ranks sum S OK". A failed check exits non-zero (MPI_Abort).
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

static void fill(unsigned char *b, int n, int seed)
{
	for (int i = 0; i < n; i++)
		b[i] = (unsigned char)(i * 7 + seed);
}

static void check(const unsigned char *b, int n, int seed, int rank)
{
	for (int i = 0; i < n; i++) {
		if (b[i] != (unsigned char)(i * 7 + seed)) {
			fprintf(stderr, "rank %d: byte %d of a %d-byte message is %u, want %u\n",
				rank, i, n, b[i], (unsigned char)(i * 7 + seed));
			MPI_Abort(MPI_COMM_WORLD, 2);
		}
	}
}

int main(int argc, char **argv)
{
	MPI_Init(&argc, &argv);
	int rank, size;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	int max = argc > 1 ? atoi(argv[1]) : 1 << 20;
	unsigned char *out = malloc(max > 0 ? max : 1), *in = malloc(max > 0 ? max : 1);
	if (!out || !in || max < 1) {
		fprintf(stderr, "usage: mpi_pingpong [MAX_BYTES >= 1]\n");
		MPI_Abort(MPI_COMM_WORLD, 1);
	}
	if (size >= 2 && rank < 2) {
		if (rank == 0)
			printf("%10s %12s %12s\n", "bytes", "usec", "MB/s");
		for (int n = 1; n <= max; n *= 16) {
			int iters = n > 65536 ? 20 : 200;
			int peer = 1 - rank;
			fill(out, n, n + rank);
			if (rank == 0) {
				/* A first exchange, unmeasured, checked. */
				MPI_Send(out, n, MPI_BYTE, peer, 0, MPI_COMM_WORLD);
				MPI_Recv(in, n, MPI_BYTE, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
				check(in, n, n + peer, rank);
			} else {
				MPI_Recv(in, n, MPI_BYTE, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
				check(in, n, n + peer, rank);
				MPI_Send(out, n, MPI_BYTE, peer, 0, MPI_COMM_WORLD);
			}
			double t0 = MPI_Wtime();
			for (int i = 0; i < iters; i++) {
				if (rank == 0) {
					MPI_Send(out, n, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
					MPI_Recv(in, n, MPI_BYTE, peer, 1, MPI_COMM_WORLD,
						 MPI_STATUS_IGNORE);
				} else {
					MPI_Recv(in, n, MPI_BYTE, peer, 1, MPI_COMM_WORLD,
						 MPI_STATUS_IGNORE);
					MPI_Send(out, n, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
				}
			}
			double half = (MPI_Wtime() - t0) / iters / 2;
			check(in, n, n + peer, rank);
			if (rank == 0)
				printf("%10d %12.2f %12.2f\n", n, half * 1e6, n / half / 1e6);
		}
	}
	long mine = rank + 1, sum = 0;
	MPI_Allreduce(&mine, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
	long want = (long)size * (size + 1) / 2;
	if (sum != want) {
		fprintf(stderr, "rank %d: allreduce gave %ld, want %ld\n", rank, sum, want);
		MPI_Abort(MPI_COMM_WORLD, 3);
	}
	if (rank == 0)
		printf("allreduce %d ranks sum %ld OK\n", size, sum);
	free(out);
	free(in);
	MPI_Finalize();
	return 0;
}
