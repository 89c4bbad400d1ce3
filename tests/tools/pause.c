/* The sandbox ("pause") container of the tests' pods, built with `cc -static` by
 * tests/src/kubelet.rs because no image can be pulled on the test machines. It does what
 * Kubernetes' own pause does: hold the pod's namespaces, reap orphans, exit on SIGINT/SIGTERM. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) {
  (void)sig;
  _exit(0);
}

static void reap(int sig) {
  (void)sig;
  while (waitpid(-1, 0, WNOHANG) > 0) {
  }
}

int main(void) {
  struct sigaction action = {0};
  action.sa_handler = stop;
  sigaction(SIGINT, &action, 0);
  sigaction(SIGTERM, &action, 0);
  action.sa_handler = reap;
  action.sa_flags = SA_NOCLDSTOP;
  sigaction(SIGCHLD, &action, 0);
  for (;;) {
    pause();
  }
}
