/* Reads one size string per line on stdin and prints the bytes the C parser gives, or "invalid";
 * the tests compare this with memslice.sizes.parse_size on the same strings. */
#include <stdio.h>
#include <string.h>

#include "ms_size.h"

int main(void) {
    char line[4096];
    while (fgets(line, sizeof line, stdin)) {
        line[strcspn(line, "\n")] = 0;
        uint64_t b;
        if (ms_parse_size(line, &b) == 0 && b > 0) printf("%llu\n", (unsigned long long)b);
        else printf("invalid\n");
    }
    return 0;
}
