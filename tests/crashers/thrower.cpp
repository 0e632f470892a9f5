// Two C++ functions that throw through a noexcept boundary (the C entry points a binding calls): the C++ runtime
// calls std::terminate, which aborts.  Built by the tests (tests/crashers/make_core.py build_thrower), never
// committed as a binary, and called through ctypes from tests/crashers/same_bug.py.
#include <stdexcept>
#include <vector>

namespace app {
struct ParseError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

__attribute__((noinline)) int parse_header(const char *text)
{
    std::vector<int> fields(3);
    return fields.at(static_cast<unsigned char>(text[0])); // std::out_of_range, thrown by vector::at
}

__attribute__((noinline)) int read_config(int version)
{
    if (version > 0)
        throw ParseError("unsupported config version");
    return version;
}
} // namespace app

extern "C" int thrower_parse_header(const char *text) noexcept { return app::parse_header(text); }
extern "C" int thrower_read_config(int version) noexcept { return app::read_config(version); }
