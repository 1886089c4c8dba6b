/* The pod sandbox's process: holds the pod's namespaces, reaps orphans (it is PID 1 when the
 * pod shares its PID namespace), and exits when told to. No registry serves the usual pause
 * image here, so the local node builds its own (hack/images.py). */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static void quit(int sig) { (void)sig; _exit(0); }
static void reap(int sig) { (void)sig; while (waitpid(-1, 0, WNOHANG) > 0) {} }

int main(void) {
    signal(SIGINT, quit);
    signal(SIGTERM, quit);
    signal(SIGCHLD, reap);
    for (;;) pause();
}
