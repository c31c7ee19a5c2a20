#include <cstdio>
int main() { std::puts("trafficrate " TRAFFICRATE_VERSION); }
