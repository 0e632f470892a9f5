/* A real crash whose stack loops, for the unwinder's loop bound (tests/integration/test_unwind.py).

   Two frame records in .bss point at each other: A says "my caller's frame is B, I return into
   loop_a", B says "my caller's frame is A, I return into loop_b".  crash() points rbp at A and
   faults.  Every function here keeps a frame pointer, so its CFI says CFA = rbp + 16, return
   address at CFA - 8, the caller's rbp at CFA - 16: an unwinder that follows the CFI goes
   crash -> loop_a -> loop_b -> loop_a -> ... for ever, each lap at the same pc and stack pointer.
   Build: gcc -O0 -g -fno-omit-frame-pointer. */
#include <stdint.h>

extern char loop_a_body[], loop_b_body[];
static uintptr_t ring[8];

void loop_a(void) { __asm__ volatile(".globl loop_a_body\nloop_a_body: nop"); }
void loop_b(void) { __asm__ volatile(".globl loop_b_body\nloop_b_body: nop"); }

void crash(void) {
    ring[0] = (uintptr_t)&ring[4];            /* A: the caller's frame is B */
    ring[1] = (uintptr_t)loop_a_body + 1;     /*    and A returns into loop_a, after its prologue */
    ring[4] = (uintptr_t)&ring[0];            /* B: the caller's frame is A */
    ring[5] = (uintptr_t)loop_b_body + 1;     /*    and B returns into loop_b */
    __asm__ volatile("mov %0, %%rbp\n\txor %%eax, %%eax\n\tmovq (%%rax), %%rax" :: "r"(&ring[0]) : "rax", "memory");
}

int main(void) {
    crash();
    return 0;
}
