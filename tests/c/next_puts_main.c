/* Prints "hello" through puts (wrapped by next_puts.c when that is preloaded); exit 1 if puts failed. */
#include <stdio.h>

int main(void) { return puts("hello") < 0; }
