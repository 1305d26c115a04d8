/* check_index.c: the index layer's numeric core (codec, FAISS bridge, sizing). */
#include "config.h"
#include <check.h>
#include <stdlib.h>
#include "codec.h"
#include "kmeans.h"
#include "plan.h"
int main(void) { return 0; }
