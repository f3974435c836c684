#include <iostream>
int main() { std::cout << "zest\n"; return 0; }
