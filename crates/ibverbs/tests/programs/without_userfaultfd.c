/*
 * Run a program where userfaultfd(2) is refused, as a container's seccomp profile may
 * refuse it (Docker's default lets only processes with CAP_SYS_PTRACE make one, and answers
 * the others EPERM):
 *
 *   without_userfaultfd PROGRAM [ARG...]
 *
 * Installs a seccomp filter that fails userfaultfd with EPERM and allows every other call,
 * then execs PROGRAM, which keeps the filter (and so do its children).
 */
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "check.h"

int main(int argc, char **argv)
{
	CHECK(argc >= 2, "usage: without_userfaultfd PROGRAM [ARG...]");
	struct sock_filter code[] = {
		/* Another architecture's calls have other numbers: refuse them all. */
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_userfaultfd, 0, 1),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
	};
	struct sock_fprog prog = { .len = sizeof code / sizeof code[0], .filter = code };
	CHECK(prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0, "PR_SET_NO_NEW_PRIVS: %s",
	      strerror(errno));
	CHECK(prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0, "seccomp: %s",
	      strerror(errno));
	CHECK(syscall(__NR_userfaultfd, 0) == -1 && errno == EPERM,
	      "userfaultfd is still allowed");
	execvp(argv[1], argv + 1);
	die("exec %s: %s", argv[1], strerror(errno));
}
