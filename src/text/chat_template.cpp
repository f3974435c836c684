#include "text/chat_template.h"
